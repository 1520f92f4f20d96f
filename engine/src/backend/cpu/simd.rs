//! Small helpers shared by the CPU kernels: feature detection (the one [`Isa`]), a pointer that may cross
//! threads, 8-lane vector loops written so LLVM vectorises them inside functions compiled
//! with `#[target_feature(enable = "avx2,fma")]`, and the element types (f32, f16, bf16)
//! the kernels load as f32 lanes ([`Elem`]: weights and the KV cache).

use half::{bf16, f16};

/// Whether the AVX2 + FMA + F16C kernels can run on this CPU (detected once, cached by std).
pub fn cpu_has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX-512F kernels can run (AVX2 + FMA + F16C included).
pub fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cpu_has_avx2() && is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether AVX-512 BW and VNNI are there too (`vpdpbusd`, the integer kernels' AVX-512 set).
fn cpu_has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cpu_has_avx512()
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction set the CPU kernels run on: the float kernels (f32 / f16 matmuls,
/// attention) take AVX2 or AVX-512F; the integer kernels (`quant::dot`) take AVX2, or
/// AVX-512 where `vnni` (BW and VNNI) is there too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512F; `vnni`: with AVX-512 BW and VNNI.
    Avx512 {
        vnni: bool,
    },
}

impl Isa {
    /// The widest set this CPU runs (detected once).
    pub fn detect() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| *Self::available().last().unwrap_or(&Isa::Scalar))
    }

    /// Every set this CPU runs, scalar first.
    pub fn available() -> Vec<Isa> {
        let mut sets = vec![Isa::Scalar];
        if cpu_has_avx2() {
            sets.push(Isa::Avx2);
        }
        if cpu_has_avx512() {
            sets.push(Isa::Avx512 { vnni: false });
        }
        if cpu_has_avx512_vnni() {
            sets.push(Isa::Avx512 { vnni: true });
        }
        sets
    }

    /// Whether this CPU runs the set (the kernels' safe entries check it once per call).
    pub fn runs_here(self) -> bool {
        match (self, Isa::detect()) {
            (Isa::Scalar, _) => true,
            (Isa::Avx2, here) => here != Isa::Scalar,
            (Isa::Avx512 { vnni: false }, here) => matches!(here, Isa::Avx512 { .. }),
            (Isa::Avx512 { vnni: true }, here) => here == Isa::Avx512 { vnni: true },
        }
    }

    /// Whether the integer kernels have SIMD code for this set (every set but scalar).
    pub fn integer_simd(self) -> bool {
        self != Isa::Scalar
    }

    /// The integer kernels' set, for start-up messages.
    pub fn integer_name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 | Isa::Avx512 { vnni: false } => "AVX2",
            Isa::Avx512 { vnni: true } => "AVX-512 VNNI",
        }
    }
}

/// A raw pointer that parallel tasks use to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub struct SendPtr<T>(pub *mut T);

// SAFETY: users only write disjoint regions from different threads (stated at each use).
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper, not the field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// `a * b + c`, fused when the caller is compiled with FMA.
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Dot product with eight partial sums.
#[inline(always)]
pub fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ac = a.chunks_exact(8);
    let mut bc = b.chunks_exact(8);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for l in 0..8 {
            acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        s = madd::<FMA>(*x, *y, s);
    }
    s
}

/// Sum with eight partial sums.
#[inline(always)]
pub fn sum<const FMA: bool>(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut c = a.chunks_exact(8);
    for x in &mut c {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for x in c.remainder() {
        s += x;
    }
    s
}

/// Sum of squares with eight partial sums.
#[inline(always)]
pub fn sum_sq<const FMA: bool>(a: &[f32]) -> f32 {
    dot::<FMA>(a, a)
}

/// `e^x` to about 2 ulp (Cephes' `expf`), in plain arithmetic so it vectorises.
/// Inputs are clamped to [-87.3, 88]: results stay finite and normal.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// An element type the kernels read (weights, the KV cache).
pub trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// The nearest element (ties to even).
    fn from_f32(x: f32) -> Self;
    /// The slice itself when the elements already are f32.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// Loads 8 consecutive elements as f32 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C, and `p..p + 8` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Loads 16 consecutive elements as f32 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, and `p..p + 16` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
}

/// `Elem` for a 16-bit float of the `half` crate, which converts it; `$load8` and
/// `$load16` widen `$p`'s 8 or 16 values to f32 lanes.
macro_rules! half_elem {
    ($t:ty, |$p:ident| $load8:expr, $load16:expr) => {
        impl Elem for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn as_f32(_: &[Self]) -> Option<&[f32]> {
                None
            }
            #[cfg(target_arch = "x86_64")]
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn load8($p: *const Self) -> std::arch::x86_64::__m256 {
                use std::arch::x86_64::*;
                $load8
            }
            #[cfg(target_arch = "x86_64")]
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn load16($p: *const Self) -> std::arch::x86_64::__m512 {
                use std::arch::x86_64::*;
                $load16
            }
        }
    };
}

half_elem!(
    f16,
    |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
);
// bf16 is the high half of an f32: widen, then shift into place.
half_elem!(
    bf16,
    |p| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
        _mm_loadu_si128(p as *const __m128i)
    ))),
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
        _mm256_loadu_si256(p as *const __m256i)
    )))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (fast_exp(x), x.exp());
            assert!((a - b).abs() <= 4e-7 * b, "exp({x}): {a} vs {b}");
            x += 0.0137;
        }
        assert!(fast_exp(-1000.0) >= 0.0 && fast_exp(-1000.0) < 1e-37);
        assert!(fast_exp(1000.0).is_finite());
    }

    #[test]
    fn dot_and_sum_match_plain_loops() {
        let a: Vec<f32> = (0..21).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..21).map(|i| (i as f32).sin()).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot::<true>(&a, &b) - want).abs() < 1e-4);
        assert!((dot::<false>(&a, &b) - want).abs() < 1e-4);
        assert!((sum::<false>(&a) - a.iter().sum::<f32>()).abs() < 1e-4);
    }
}
