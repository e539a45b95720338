//! The control-frame decoder never panics, whatever the bytes: random byte strings, random
//! bytes behind a valid header, and mutations of valid frames. The normal run tries a few
//! thousand inputs; `cargo test -p shardc-runtime --release --test cluster_frame_fuzz --
//! --ignored` tries 100,000 of each kind.

use proptest::prelude::*;
use shardc_runtime::cluster::frame::{
    decode, decode_with_limit, encode, Message, PeerEntry, MAGIC, MAX_CONTROL_FRAME,
};

/// Decodes every prefix-free split of `bytes` the way the async reader would and checks the
/// decoder's contract: a frame consumes at least a header and at most the input.
fn check(bytes: &[u8]) {
    for limit in [MAX_CONTROL_FRAME, 16] {
        if let Ok(Some((_, used))) = decode_with_limit(bytes, limit) {
            assert!((9..=bytes.len()).contains(&used));
        }
    }
    if let Ok(Some((msg, used))) = decode(bytes) {
        // What decodes re-encodes to the same bytes.
        assert_eq!(encode(&msg), bytes[..used]);
    }
}

fn valid_frames() -> Vec<Vec<u8>> {
    [
        Message::Register {
            node_id: Some("n1".into()),
            requested_rank: Some(1),
            host_id: "boot/net".into(),
            data_port: 4000,
            pid: 77,
            hostname: "h".into(),
            worker_num: 4,
        },
        Message::Assign {
            rank: 0,
            size: 2,
            job_id: "j".into(),
            peers: vec![
                PeerEntry {
                    rank: 0,
                    host_id: "a".into(),
                    ip: "127.0.0.1".parse().unwrap(),
                    data_port: 1,
                    node_id: "x".into(),
                },
                PeerEntry {
                    rank: 1,
                    host_id: "b".into(),
                    ip: "::1".parse().unwrap(),
                    data_port: 2,
                    node_id: String::new(),
                },
            ],
        },
        Message::Abort {
            lost_rank: Some(3),
            reason: "rank 3 was lost".into(),
        },
        Message::Challenge {
            nonce: [5; 32],
            token_required: true,
        },
    ]
    .iter()
    .map(encode)
    .collect()
}

fn random_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..96)
}

fn behind_header() -> impl Strategy<Value = Vec<u8>> {
    (1u8..=12, prop::collection::vec(any::<u8>(), 0..96)).prop_map(|(kind, payload)| {
        let mut f = MAGIC.to_vec();
        f.push(kind);
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.extend_from_slice(&payload);
        f
    })
}

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        0usize..4,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    )
        .prop_map(|(which, edits)| {
            let mut f = valid_frames()[which].clone();
            for (at, byte) in edits {
                let i = at.index(f.len());
                f[i] = byte;
            }
            f
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in random_bytes()) { check(&bytes); }

    #[test]
    fn random_payloads_never_panic(bytes in behind_header()) { check(&bytes); }

    #[test]
    fn mutated_frames_never_panic(bytes in mutated()) { check(&bytes); }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100_000, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "100k inputs per property; run with --ignored (release recommended)"]
    fn random_bytes_never_panic_100k(bytes in random_bytes()) { check(&bytes); }

    #[test]
    #[ignore = "100k inputs per property; run with --ignored (release recommended)"]
    fn random_payloads_never_panic_100k(bytes in behind_header()) { check(&bytes); }

    #[test]
    #[ignore = "100k inputs per property; run with --ignored (release recommended)"]
    fn mutated_frames_never_panic_100k(bytes in mutated()) { check(&bytes); }
}

#[test]
fn valid_frames_decode() {
    for f in valid_frames() {
        let (_, used) = decode(&f).unwrap().unwrap();
        assert_eq!(used, f.len());
    }
}
