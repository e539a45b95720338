//! Dropout's masks, as every backend draws them: a counter-based hash of (seed0, seed1,
//! step, element index), so a mask depends on nothing else (not on threads, chunking, or the
//! device) and a rank's block draws the single device's mask through global indices.

/// SplitMix64's finaliser.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The multiplier of the element index in [`uniform`].
pub const INDEX_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// The per-step key of a Dropout node: everything of the hash but the element index.
#[inline(always)]
pub fn key(seed0: i64, seed1: i64, step: u64) -> u64 {
    mix64(
        mix64(seed0 as u64 ^ 0x9e37_79b9_7f4a_7c15)
            ^ mix64((seed1 as u64).wrapping_add(0x3c6e_f372_fe94_f82b))
            ^ mix64(step.wrapping_add(0xa54f_f53a_5f1d_36f1)),
    )
}

/// The uniform number in `[0, 1)` of global element `index` under `key`: the element is kept
/// when it is below `keep_prob`.
#[inline(always)]
pub fn uniform(key: u64, index: u64) -> f64 {
    let h = mix64(key ^ index.wrapping_mul(INDEX_MULTIPLIER));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
