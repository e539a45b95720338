//! Emulated HCCL: ranks as threads (each on its own device, as the communicator conformance
//! suite runs them) and ranks as processes (this test binary re-run as children).
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use common::*;
use shardc_ascend_emulator::acl::*;
use shardc_ascend_emulator::hccl::*;
use shardc_ascend_sys::{self as sys, HcclComm, HcclRootInfo};
use std::ffi::{c_void, CStr};
use std::io::{BufRead, BufReader};
use std::ptr::null_mut;
use std::sync::{Arc, Barrier};

fn root() -> HcclRootInfo {
    let mut r = HcclRootInfo::default();
    assert_eq!(unsafe { HcclGetRootInfo(&mut r) }, 0);
    r
}

fn recent() -> String {
    let p = unsafe { aclGetRecentErrMsg() };
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Runs `f(rank, comm, stream)` on `n` threads, rank r on device r.
fn ranks<F>(n: usize, f: F)
where
    F: Fn(usize, HcclComm, sys::aclrtStream) + Sync,
{
    let info = root();
    std::thread::scope(|s| {
        for r in 0..n {
            let f = &f;
            s.spawn(move || {
                setup(r as i32);
                let mut comm = null_mut();
                assert_eq!(
                    unsafe { HcclCommInitRootInfo(n as u32, &info, r as u32, &mut comm) },
                    0
                );
                let mut st = null_mut();
                assert_eq!(unsafe { aclrtCreateStream(&mut st) }, 0);
                f(r, comm, st);
                assert_eq!(unsafe { aclrtDestroyStream(st) }, 0);
                assert_eq!(unsafe { HcclCommDestroy(comm) }, 0);
            });
        }
    });
}

fn sync_s(s: sys::aclrtStream) -> i32 {
    unsafe { aclrtSynchronizeStream(s) }
}

fn upload(v: &[f32]) -> *mut c_void {
    let p = malloc(v.len() * 4);
    h2d(p, &f32b(v));
    p
}

fn download(p: *mut c_void, n: usize) -> Vec<f32> {
    bf32(&d2h(p, n * 4))
}

#[test]
fn collectives_between_four_threads() {
    ranks(4, |r, comm, s| unsafe {
        let mut n = 0u32;
        assert_eq!(HcclGetRankSize(comm, &mut n), 0);
        assert_eq!(n, 4);
        let mut me = 9u32;
        assert_eq!(HcclGetRankId(comm, &mut me), 0);
        assert_eq!(me as usize, r);
        let rf = (r + 1) as f32;
        // AllReduce with every reduce op.
        let x = upload(&[rf, 2.0 * rf, 3.0 * rf]);
        let y = malloc(12);
        for (op, want) in [
            (sys::HCCL_REDUCE_SUM, [10., 20., 30.]),
            (sys::HCCL_REDUCE_MAX, [4., 8., 12.]),
            (sys::HCCL_REDUCE_MIN, [1., 2., 3.]),
            (sys::HCCL_REDUCE_PROD, [24., 24. * 16., 24. * 81.]),
        ] {
            assert_eq!(
                HcclAllReduce(x, y, 3, sys::HCCL_DATA_TYPE_FP32, op, comm, s),
                0
            );
            assert_eq!(sync_s(s), 0);
            assert_eq!(download(y, 3), want, "allreduce op {op} on rank {r}");
        }
        // In place, larger than a slot: chunks, summed in rank order.
        let big: Vec<f32> = (0..300_000)
            .map(|i| r as f32 * 0.1 + i as f32 * 0.5)
            .collect();
        let b = upload(&big);
        assert_eq!(
            HcclAllReduce(
                b,
                b,
                big.len() as u64,
                sys::HCCL_DATA_TYPE_FP32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        let got = download(b, big.len());
        for i in [0usize, 1, 262_143, 262_144, 299_999] {
            let mut acc = 0.0f32 * 0.1 + i as f32 * 0.5;
            for q in 1..4 {
                acc += q as f32 * 0.1 + i as f32 * 0.5;
            }
            assert_eq!(got[i].to_bits(), acc.to_bits(), "element {i}");
        }
        // AllGather.
        let g = upload(&[r as f32, r as f32]);
        let go = malloc(32);
        assert_eq!(
            HcclAllGather(g, go, 2, sys::HCCL_DATA_TYPE_FP32, comm, s),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(download(go, 8), vec![0., 0., 1., 1., 2., 2., 3., 3.]);
        // ReduceScatter.
        let rs: Vec<f32> = (0..8).map(|j| (r * 100 + j) as f32).collect();
        let ri = upload(&rs);
        let ro = malloc(8);
        assert_eq!(
            HcclReduceScatter(
                ri,
                ro,
                2,
                sys::HCCL_DATA_TYPE_FP32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        let base = 600.0 + 8.0 * r as f32;
        assert_eq!(download(ro, 2), vec![base, base + 4.0]);
        // Broadcast from rank 2.
        let bc = upload(&[r as f32; 4]);
        assert_eq!(
            HcclBroadcast(bc, 4, sys::HCCL_DATA_TYPE_FP32, 2, comm, s),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(download(bc, 4), vec![2.0; 4]);
        // Send / receive around the ring.
        let snd = upload(&[r as f32 * 1.5; 3]);
        let rcv = malloc(12);
        assert_eq!(
            HcclSend(
                snd,
                3,
                sys::HCCL_DATA_TYPE_FP32,
                ((r + 1) % 4) as u32,
                comm,
                s
            ),
            0
        );
        assert_eq!(
            HcclRecv(
                rcv,
                3,
                sys::HCCL_DATA_TYPE_FP32,
                ((r + 3) % 4) as u32,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(download(rcv, 3), vec![((r + 3) % 4) as f32 * 1.5; 3]);
        // AlltoAll.
        let at: Vec<f32> = (0..4).map(|j| (10 * r + j) as f32).collect();
        let ai = upload(&at);
        let ao = malloc(16);
        assert_eq!(
            HcclAlltoAll(
                ai,
                1,
                sys::HCCL_DATA_TYPE_FP32,
                ao,
                1,
                sys::HCCL_DATA_TYPE_FP32,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(
            download(ao, 4),
            (0..4).map(|q| (10 * q + r) as f32).collect::<Vec<_>>()
        );
        // Batched exchange both ways with a partner, larger than a channel slot.
        let peer = r ^ 1;
        let mine: Vec<f32> = (0..100_000).map(|i| (r * 1_000_000 + i) as f32).collect();
        let bs = upload(&mine);
        let br = malloc(400_000);
        let mut items = [
            sys::HcclSendRecvItem {
                sendRecvType: sys::HCCL_SEND,
                buf: bs,
                count: 100_000,
                dataType: sys::HCCL_DATA_TYPE_FP32,
                remoteRank: peer as u32,
            },
            sys::HcclSendRecvItem {
                sendRecvType: sys::HCCL_RECV,
                buf: br,
                count: 100_000,
                dataType: sys::HCCL_DATA_TYPE_FP32,
                remoteRank: peer as u32,
            },
        ];
        assert_eq!(HcclBatchSendRecv(items.as_mut_ptr(), 2, comm, s), 0);
        assert_eq!(sync_s(s), 0);
        let theirs = download(br, 100_000);
        assert_eq!(theirs[99_999], (peer * 1_000_000 + 99_999) as f32);
        let mut e = sys::HCCL_E_INTERNAL;
        assert_eq!(HcclGetCommAsyncError(comm, &mut e), 0);
        assert_eq!(e, sys::HCCL_SUCCESS);
    });
}

#[test]
fn integer_and_half_reductions() {
    ranks(2, |r, comm, s| unsafe {
        let v: Vec<u8> = [r as i32 - 5, 7]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let p = malloc(8);
        h2d(p, &v);
        assert_eq!(
            HcclAllReduce(
                p,
                p,
                2,
                sys::HCCL_DATA_TYPE_INT32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        let b = d2h(p, 8);
        assert_eq!(i32::from_le_bytes(b[..4].try_into().unwrap()), -9);
        assert_eq!(i32::from_le_bytes(b[4..].try_into().unwrap()), 14);
        // f16 1.5 + 1.5 = 3.0.
        let h = malloc(2);
        h2d(h, &0x3e00u16.to_le_bytes());
        assert_eq!(
            HcclAllReduce(
                h,
                h,
                1,
                sys::HCCL_DATA_TYPE_FP16,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(d2h(h, 2), 0x4200u16.to_le_bytes());
    });
}

#[test]
fn mismatched_calls_fail_on_every_member_without_hanging() {
    let t0 = std::time::Instant::now();
    ranks(4, |r, comm, s| unsafe {
        let x = upload(&[1.0; 8]);
        // Rank 3 reduces 4 elements, the others 3.
        let count = if r == 3 { 4 } else { 3 };
        assert_eq!(
            HcclAllReduce(
                x,
                x,
                count,
                sys::HCCL_DATA_TYPE_FP32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), sys::ACL_ERROR_FAILURE);
        let m = recent();
        assert!(
            m.contains("disagree") && m.contains("count 4") && m.contains("count 3"),
            "{m}"
        );
        let mut e = 0;
        assert_eq!(HcclGetCommAsyncError(comm, &mut e), 0);
        assert_eq!(e, sys::HCCL_E_PARA);
        // The communicator is unusable afterwards, and says so at once.
        assert_eq!(
            HcclAllReduce(
                x,
                x,
                3,
                sys::HCCL_DATA_TYPE_FP32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_ne!(sync_s(s), 0);
    });
    ranks(3, |r, comm, s| unsafe {
        let x = upload(&[1.0; 8]);
        let y = malloc(64);
        if r == 1 {
            assert_eq!(HcclAllGather(x, y, 2, sys::HCCL_DATA_TYPE_FP32, comm, s), 0);
        } else {
            assert_eq!(
                HcclAllReduce(
                    x,
                    y,
                    2,
                    sys::HCCL_DATA_TYPE_FP32,
                    sys::HCCL_REDUCE_SUM,
                    comm,
                    s
                ),
                0
            );
        }
        assert_eq!(sync_s(s), sys::ACL_ERROR_FAILURE);
        let m = recent();
        assert!(
            m.contains("HcclAllGather") && m.contains("HcclAllReduce"),
            "{m}"
        );
    });
    // A receive that disagrees with the matching send.
    ranks(2, |r, comm, s| unsafe {
        let x = upload(&[1.0; 8]);
        if r == 0 {
            assert_eq!(HcclSend(x, 4, sys::HCCL_DATA_TYPE_FP32, 1, comm, s), 0);
        } else {
            assert_eq!(HcclRecv(x, 8, sys::HCCL_DATA_TYPE_FP32, 0, comm, s), 0);
        }
        // A message of one chunk is buffered: the sender may already be done; the receiver
        // refuses it.
        let rc = sync_s(s);
        let mut e = 0;
        HcclGetCommAsyncError(comm, &mut e);
        if r == 1 {
            assert_ne!(rc, 0);
            assert_eq!(e, sys::HCCL_E_PARA);
            assert!(recent().contains("8 elements"), "{}", recent());
        }
    });
    assert!(
        t0.elapsed().as_secs() < 20,
        "mismatches must not wait for a timeout"
    );
}

#[test]
fn a_peer_that_destroyed_its_communicator_is_named() {
    let info = root();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            setup(0);
            let mut comm = null_mut();
            assert_eq!(unsafe { HcclCommInitRootInfo(2, &info, 0, &mut comm) }, 0);
            let x = upload(&[1.0]);
            unsafe {
                assert_eq!(
                    HcclAllReduce(
                        x,
                        x,
                        1,
                        sys::HCCL_DATA_TYPE_FP32,
                        sys::HCCL_REDUCE_SUM,
                        comm,
                        null_mut()
                    ),
                    0
                );
                assert_eq!(aclrtSynchronizeStream(null_mut()), sys::ACL_ERROR_FAILURE);
                let m = recent();
                assert!(m.contains("rank 1 destroyed its communicator"), "{m}");
                let mut e = 0;
                HcclGetCommAsyncError(comm, &mut e);
                assert_eq!(e, sys::HCCL_E_REMOTE);
            }
        });
        sc.spawn(|| {
            setup(1);
            let mut comm = null_mut();
            assert_eq!(unsafe { HcclCommInitRootInfo(2, &info, 1, &mut comm) }, 0);
            assert_eq!(unsafe { HcclCommDestroy(comm) }, 0);
            let mut n = 0;
            assert_eq!(
                unsafe { HcclGetRankSize(comm, &mut n) },
                sys::HCCL_E_PARA,
                "destroyed handle"
            );
        });
    });
}

/// Entry point of the child processes of the tests below (does nothing in a normal run).
#[test]
fn hccl_child() {
    let Ok(mode) = std::env::var("EMU_CHILD_MODE") else {
        return;
    };
    match mode.as_str() {
        "missing-rank" => {
            // 3 of 4 ranks arrive; HCCL_CONNECT_TIMEOUT=1.
            let info = root();
            std::thread::scope(|sc| {
                for r in 0..3u32 {
                    sc.spawn(move || {
                        setup(r as i32);
                        let mut comm = null_mut();
                        let t = std::time::Instant::now();
                        let rc = unsafe { HcclCommInitRootInfo(4, &info, r, &mut comm) };
                        assert_eq!(rc, sys::HCCL_E_TIMEOUT);
                        assert!(t.elapsed().as_secs_f64() < 5.0);
                        let m = recent();
                        assert!(
                            m.contains("ranks [3] of 4 did not arrive")
                                && m.contains("HCCL_CONNECT_TIMEOUT"),
                            "{m}"
                        );
                    });
                }
            });
            println!("CHILD-OK");
        }
        "exec-timeout" => {
            // Rank 1 never joins the collective (but stays alive); HCCL_EXEC_TIMEOUT=1.
            let info = root();
            let done = Arc::new(Barrier::new(2));
            std::thread::scope(|sc| {
                for r in 0..2u32 {
                    let done = done.clone();
                    sc.spawn(move || {
                        setup(r as i32);
                        let mut comm = null_mut();
                        assert_eq!(unsafe { HcclCommInitRootInfo(2, &info, r, &mut comm) }, 0);
                        let r0 = std::panic::catch_unwind(|| {
                            if r == 0 {
                                let x = upload(&[1.0]);
                                unsafe {
                                    assert_eq!(
                                        HcclAllReduce(
                                            x,
                                            x,
                                            1,
                                            sys::HCCL_DATA_TYPE_FP32,
                                            sys::HCCL_REDUCE_SUM,
                                            comm,
                                            null_mut()
                                        ),
                                        0
                                    );
                                    assert_eq!(
                                        aclrtSynchronizeStream(null_mut()),
                                        sys::ACL_ERROR_FAILURE
                                    );
                                    let m = recent();
                                    assert!(
                                        m.contains(
                                            "ranks [1] did not arrive within HCCL_EXEC_TIMEOUT"
                                        ),
                                        "{m}"
                                    );
                                    let mut e = 0;
                                    HcclGetCommAsyncError(comm, &mut e);
                                    assert_eq!(e, sys::HCCL_E_TIMEOUT);
                                }
                            }
                        });
                        // Rank 1 stays alive (and in the communicator) until rank 0 is done.
                        done.wait();
                        if let Err(p) = r0 {
                            std::panic::resume_unwind(p);
                        }
                    });
                }
            });
            println!("CHILD-OK");
        }
        "rank" => {
            let rank: u32 = std::env::var("EMU_RANK").unwrap().parse().unwrap();
            let hex = std::env::var("EMU_ROOT").unwrap();
            let mut info = HcclRootInfo::default();
            for (i, b) in (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .enumerate()
            {
                info.internal[i] = b as std::ffi::c_char;
            }
            setup(rank as i32);
            let mut comm = null_mut();
            assert_eq!(
                unsafe { HcclCommInitRootInfo(2, &info, rank, &mut comm) },
                0
            );
            println!("READY");
            if std::env::var("EMU_STALL").is_ok() {
                std::thread::sleep(std::time::Duration::from_secs(60));
                return;
            }
            let x = upload(&[rank as f32 + 1.0, 10.0 * (rank as f32 + 1.0)]);
            unsafe {
                assert_eq!(
                    HcclAllReduce(
                        x,
                        x,
                        2,
                        sys::HCCL_DATA_TYPE_FP32,
                        sys::HCCL_REDUCE_SUM,
                        comm,
                        null_mut()
                    ),
                    0
                );
                let rc = aclrtSynchronizeStream(null_mut());
                if rc == 0 {
                    let v = download(x, 2);
                    println!("RESULT {} {}", v[0], v[1]);
                } else {
                    println!("FAILED {rc} {}", recent());
                }
                HcclCommDestroy(comm);
            }
        }
        m => panic!("unknown child mode {m}"),
    }
}

fn root_hex() -> String {
    root()
        .internal
        .iter()
        .map(|&c| format!("{:02x}", c as u8))
        .collect()
}

fn finish(c: std::process::Child) -> String {
    let out = c.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    text
}

#[test]
fn a_rank_that_never_comes_times_out() {
    let c = child(
        "hccl_child",
        &[
            ("EMU_CHILD_MODE", "missing-rank".into()),
            ("HCCL_CONNECT_TIMEOUT", "1".into()),
        ],
    );
    assert!(finish(c).contains("CHILD-OK"));
}

#[test]
fn a_rank_that_never_joins_a_collective_times_out() {
    let c = child(
        "hccl_child",
        &[
            ("EMU_CHILD_MODE", "exec-timeout".into()),
            ("HCCL_EXEC_TIMEOUT", "1".into()),
        ],
    );
    assert!(finish(c).contains("CHILD-OK"));
}

#[test]
fn all_reduce_between_two_processes() {
    let hex = root_hex();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            child(
                "hccl_child",
                &[
                    ("EMU_CHILD_MODE", "rank".into()),
                    ("EMU_RANK", r.to_string()),
                    ("EMU_ROOT", hex.clone()),
                    ("HCCL_EXEC_TIMEOUT", "30".into()),
                ],
            )
        })
        .collect();
    for k in kids {
        let out = finish(k);
        assert!(out.contains("RESULT 3 30"), "{out}");
    }
    // Every rank mapped the segment, so its name is gone from /dev/shm.
    let leftover = std::fs::read_dir("/dev/shm").unwrap().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        hex_contains(&hex, &n)
    });
    assert!(
        !leftover,
        "the segment of a finished job must not stay in /dev/shm"
    );
}

fn hex_contains(hex: &str, name: &str) -> bool {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let s = String::from_utf8_lossy(&bytes);
    s.contains(name)
}

#[test]
fn a_killed_process_fails_its_peers_call_naming_it() {
    let hex = root_hex();
    let env = |r: u32, stall: bool| {
        let mut v = vec![
            ("EMU_CHILD_MODE", "rank".to_string()),
            ("EMU_RANK", r.to_string()),
            ("EMU_ROOT", hex.clone()),
            ("HCCL_EXEC_TIMEOUT", "60".into()),
        ];
        if stall {
            v.push(("EMU_STALL", "1".into()));
        }
        v
    };
    let mut victim = child("hccl_child", &env(1, true));
    let survivor = child("hccl_child", &env(0, false));
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    let t0 = std::time::Instant::now();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("READY") => break,
            Some(_) => {}
            None => panic!("the victim ended before it was ready"),
        }
        assert!(t0.elapsed().as_secs() < 30);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    victim.kill().unwrap();
    victim.wait().unwrap();
    let out = finish(survivor);
    assert!(
        out.contains("FAILED") && out.contains("rank 1") && out.contains("is lost"),
        "{out}"
    );
    assert!(
        t0.elapsed().as_secs() < 30,
        "the lost rank must be noticed at once"
    );
}

#[test]
fn a_ring_of_batched_sends_and_receives_does_not_deadlock() {
    for count in [8usize, 150_000] {
        ranks(3, |r, comm, s| unsafe {
            let (next, prev) = ((r + 1) % 3, (r + 2) % 3);
            let mine: Vec<f32> = (0..count).map(|i| (r * 7 + i % 5) as f32).collect();
            let bs = upload(&mine);
            let br = malloc(count * 4);
            let mut items = [
                sys::HcclSendRecvItem {
                    sendRecvType: sys::HCCL_SEND,
                    buf: bs,
                    count: count as u64,
                    dataType: sys::HCCL_DATA_TYPE_FP32,
                    remoteRank: next as u32,
                },
                sys::HcclSendRecvItem {
                    sendRecvType: sys::HCCL_RECV,
                    buf: br,
                    count: count as u64,
                    dataType: sys::HCCL_DATA_TYPE_FP32,
                    remoteRank: prev as u32,
                },
            ];
            assert_eq!(HcclBatchSendRecv(items.as_mut_ptr(), 2, comm, s), 0);
            assert_eq!(sync_s(s), 0);
            let got = download(br, count);
            let want: Vec<f32> = (0..count).map(|i| (prev * 7 + i % 5) as f32).collect();
            assert_eq!(got, want, "rank {r}, {count} elements");
        });
    }
}

#[test]
fn a_ring_of_large_single_sends_is_a_deadlock_reported_not_a_hang() {
    // Each rank sends more than one chunk to the next before receiving: nobody receives.
    let t0 = std::time::Instant::now();
    ranks(3, |r, comm, s| unsafe {
        let count = 200_000usize;
        let bs = upload(&vec![r as f32; count]);
        let br = malloc(count * 4);
        assert_eq!(
            HcclSend(
                bs,
                count as u64,
                sys::HCCL_DATA_TYPE_FP32,
                ((r + 1) % 3) as u32,
                comm,
                s
            ),
            0
        );
        assert_eq!(
            HcclRecv(
                br,
                count as u64,
                sys::HCCL_DATA_TYPE_FP32,
                ((r + 2) % 3) as u32,
                comm,
                s
            ),
            0
        );
        assert_ne!(sync_s(s), 0);
        let m = recent();
        assert!(
            m.contains("deadlock") || m.contains("failed an earlier call"),
            "{m}"
        );
    });
    assert!(t0.elapsed().as_secs() < 10);
}

#[test]
fn a_collective_racing_with_another_streams_write_is_refused() {
    ranks(1, |_, comm, s| unsafe {
        let mut compute = null_mut();
        assert_eq!(aclrtCreateStream(&mut compute), 0);
        let x = malloc(16);
        let host = f32b(&[1.0; 4]);
        assert_eq!(
            aclrtMemcpyAsync(
                x,
                16,
                host.as_ptr() as *const c_void,
                16,
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
                compute
            ),
            0
        );
        // The gradient is written on the compute stream; reducing it on the communication
        // stream without an event between them is a race.
        let r = HcclAllReduce(
            x,
            x,
            4,
            sys::HCCL_DATA_TYPE_FP32,
            sys::HCCL_REDUCE_SUM,
            comm,
            s,
        );
        assert_eq!(r, sys::HCCL_E_RUNTIME);
        assert!(recent().contains("not ordered before it"), "{}", recent());
        let mut e = null_mut();
        assert_eq!(aclrtCreateEvent(&mut e), 0);
        assert_eq!(aclrtRecordEvent(e, compute), 0);
        assert_eq!(aclrtStreamWaitEvent(s, e), 0);
        assert_eq!(
            HcclAllReduce(
                x,
                x,
                4,
                sys::HCCL_DATA_TYPE_FP32,
                sys::HCCL_REDUCE_SUM,
                comm,
                s
            ),
            0
        );
        assert_eq!(sync_s(s), 0);
        assert_eq!(download(x, 4), vec![1.0; 4]);
        assert_eq!(aclrtDestroyStream(compute), 0);
    });
}
