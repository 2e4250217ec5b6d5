//! Deterministic synthetic text: words from a fixed vocabulary with a Zipf-like skew, so
//! that some words are common and most are rare, as in real notes.

/// A small, fast, seeded generator (xorshift64*); benchmarks need repeatability, not secrecy.
pub struct Rng(u64);

impl Rng {
    /// Seeds the generator (0 is replaced, xorshift cannot leave it).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The vocabulary size.
pub const VOCABULARY: usize = 5000;
const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "do", "fe", "gi", "ho", "ju",
];

/// The `i`-th vocabulary word: three syllables, distinct for every `i < 4096`, four above.
pub fn word(i: usize) -> String {
    let n = SYLLABLES.len();
    let mut w = String::new();
    let mut x = i;
    for _ in 0..if i < n * n * n { 3 } else { 4 } {
        w.push_str(SYLLABLES[x % n]);
        x /= n;
    }
    w
}

/// A word drawn with a skew toward low indexes (roughly Zipf with s = 1).
pub fn skewed_word(rng: &mut Rng) -> String {
    // Inverse-CDF sampling of a log-uniform rank approximates Zipf(1).
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let rank = ((VOCABULARY as f64).powf(u) as usize).clamp(1, VOCABULARY) - 1;
    word(rank)
}

/// A sentence of `n` skewed words.
pub fn sentence(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| skewed_word(rng))
        .collect::<Vec<_>>()
        .join(" ")
}
