//! The seeded generator behind every shuffle in the plan.
//!
//! It is written here rather than taken from a crate on purpose: a published
//! sample order must stay the same across dependency upgrades, so the
//! generator and the way it turns into permutations are frozen with the
//! contract. SplitMix64 mixes the inputs into a seed; xoshiro256** draws.

/// SplitMix64 finaliser: a bijective 64-bit mix.
pub const fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combines several values into one seed, order-sensitively.
pub fn seed_of(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6772_616e_6172_7900, |acc, &p| mix64(acc ^ mix64(p)))
}

/// xoshiro256** seeded through SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is a function of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut s = [0u64; 4];
        for slot in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *slot = mix64(x);
        }
        Self { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` (Lemire's method, unbiased). `n` must be non-zero.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Fisher-Yates shuffle, from the last element down.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freezes the stream: if this fails, every published plan changed.
    #[test]
    fn stream_is_frozen() {
        let mut r = Rng::new(42);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        let mut again = Rng::new(42);
        assert_eq!(got, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        let mut v: Vec<u32> = (0..10).collect();
        Rng::new(7).shuffle(&mut v);
        assert_eq!(v, FROZEN_SHUFFLE_7);
    }

    const FROZEN_SHUFFLE_7: [u32; 10] = [0, 1, 5, 8, 6, 9, 2, 7, 4, 3];

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(1);
        for n in [1u64, 2, 3, 7, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(r.below(n) < n);
            }
        }
    }
}
