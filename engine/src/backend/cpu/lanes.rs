//! Vectors of f32 lanes, one type per instruction set, so that a float kernel is written
//! once over [`Lanes`] and [`dispatch`]ed compiled for the set this CPU runs: the kernel's
//! `#[inline(always)]` body is inlined into one `#[target_feature]` entry per set, and the
//! lanes' `#[inline]` intrinsics into it (the AVX entries' loops are the hand-written
//! kernels' loops: `vfmadd231ps` on registers, no calls).

use super::simd::{Elem, Isa};

/// One instruction set's vector of f32 lanes.
///
/// # Safety
/// Every method runs only where the CPU has the set's instructions ([`dispatch`] sees to
/// it); pointers are readable (writable) for the lanes they load (store).
pub trait Lanes {
    /// One register of [`Lanes::N`] lanes.
    type V: Copy;
    /// Sixteen lanes (one register or two): a block of keys or dimensions in attention.
    type V16: Copy;
    /// Lanes per register.
    const N: usize;
    /// Vector registers the set has, as counted in `V`s (a kernel sizes its tile of
    /// accumulators by them).
    const REGISTERS: usize;
    /// Whether [`Lanes::fmadd`] is one fused instruction (the scalar helpers of
    /// `simd.rs` follow it).
    const FMA: bool;

    unsafe fn zero() -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    /// `N` elements of a weight or cache type, widened to f32.
    unsafe fn load_elem<E: Elem>(p: *const E) -> Self::V;
    /// `a·b + c`.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The sum of the lanes.
    unsafe fn hsum(v: Self::V) -> f32;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// A hint that `p` is read soon (never faults).
    unsafe fn prefetch<T>(p: *const T);

    unsafe fn zero16() -> Self::V16;
    unsafe fn load16<E: Elem>(p: *const E) -> Self::V16;
    /// `a·b + c` with `a` over all sixteen lanes.
    unsafe fn splat_fmadd16(a: f32, b: Self::V16, c: Self::V16) -> Self::V16;
    unsafe fn store16(p: *mut f32, v: Self::V16);
}

/// A kernel written once over [`Lanes`].
pub trait Kernel {
    type Output;

    /// # Safety
    /// The CPU runs `L`'s instructions; the kernel's own conditions hold.
    unsafe fn run<L: Lanes>(self) -> Self::Output;
}

/// Runs `kernel` with the lanes of `isa`.
///
/// # Safety
/// `isa` is one this CPU runs ([`Isa::available`]); the kernel's own conditions hold.
pub unsafe fn dispatch<K: Kernel>(isa: Isa, kernel: K) -> K::Output {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 { .. } => with_avx512(kernel),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => with_avx2(kernel),
        _ => kernel.run::<Plain>(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn with_avx512<K: Kernel>(kernel: K) -> K::Output {
    kernel.run::<Avx512>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_avx2<K: Kernel>(kernel: K) -> K::Output {
    kernel.run::<Avx2>()
}

/// Plain arrays of eight (any CPU; unfused multiply-add).
pub struct Plain;

impl Lanes for Plain {
    type V = [f32; 8];
    type V16 = [f32; 16];
    const N: usize = 8;
    /// An `[f32; 8]` takes two of the 16 SSE registers.
    const REGISTERS: usize = 8;
    const FMA: bool = false;

    #[inline(always)]
    unsafe fn zero() -> [f32; 8] {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 8] {
        std::array::from_fn(|l| *p.add(l))
    }
    #[inline(always)]
    unsafe fn load_elem<E: Elem>(p: *const E) -> [f32; 8] {
        std::array::from_fn(|l| (*p.add(l)).to_f32())
    }
    #[inline(always)]
    unsafe fn fmadd(a: [f32; 8], b: [f32; 8], c: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|l| c[l] + a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn hsum(v: [f32; 8]) -> f32 {
        v.iter().sum()
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 8]) {
        std::ptr::copy_nonoverlapping(v.as_ptr(), p, 8);
    }
    #[inline(always)]
    unsafe fn prefetch<T>(_: *const T) {}
    #[inline(always)]
    unsafe fn zero16() -> [f32; 16] {
        [0.0; 16]
    }
    #[inline(always)]
    unsafe fn load16<E: Elem>(p: *const E) -> [f32; 16] {
        std::array::from_fn(|l| (*p.add(l)).to_f32())
    }
    #[inline(always)]
    unsafe fn splat_fmadd16(a: f32, b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| c[l] + a * b[l])
    }
    #[inline(always)]
    unsafe fn store16(p: *mut f32, v: [f32; 16]) {
        std::ptr::copy_nonoverlapping(v.as_ptr(), p, 16);
    }
}

/// 256-bit registers.
#[cfg(target_arch = "x86_64")]
pub struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    type V = std::arch::x86_64::__m256;
    type V16 = [std::arch::x86_64::__m256; 2];
    const N: usize = 8;
    const REGISTERS: usize = 16;
    const FMA: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::V {
        std::arch::x86_64::_mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> Self::V {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_elem<E: Elem>(p: *const E) -> Self::V {
        E::load8(p)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_fmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: Self::V) -> f32 {
        use std::arch::x86_64::*;
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(p: *mut f32, v: Self::V) {
        std::arch::x86_64::_mm256_storeu_ps(p, v)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefetch<T>(p: *const T) {
        use std::arch::x86_64::*;
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero16() -> Self::V16 {
        [Self::zero(); 2]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load16<E: Elem>(p: *const E) -> Self::V16 {
        [E::load8(p), E::load8(p.add(8))]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat_fmadd16(a: f32, b: Self::V16, c: Self::V16) -> Self::V16 {
        let a = std::arch::x86_64::_mm256_set1_ps(a);
        [Self::fmadd(a, b[0], c[0]), Self::fmadd(a, b[1], c[1])]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store16(p: *mut f32, v: Self::V16) {
        Self::store(p, v[0]);
        Self::store(p.add(8), v[1]);
    }
}

/// 512-bit registers.
#[cfg(target_arch = "x86_64")]
pub struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    type V = std::arch::x86_64::__m512;
    type V16 = std::arch::x86_64::__m512;
    const N: usize = 16;
    const REGISTERS: usize = 32;
    const FMA: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn zero() -> Self::V {
        std::arch::x86_64::_mm512_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> Self::V {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load_elem<E: Elem>(p: *const E) -> Self::V {
        E::load16(p)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_fmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn hsum(v: Self::V) -> f32 {
        std::arch::x86_64::_mm512_reduce_add_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn store(p: *mut f32, v: Self::V) {
        std::arch::x86_64::_mm512_storeu_ps(p, v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn prefetch<T>(p: *const T) {
        use std::arch::x86_64::*;
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn zero16() -> Self::V16 {
        Self::zero()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16<E: Elem>(p: *const E) -> Self::V16 {
        E::load16(p)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn splat_fmadd16(a: f32, b: Self::V16, c: Self::V16) -> Self::V16 {
        Self::fmadd(std::arch::x86_64::_mm512_set1_ps(a), b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn store16(p: *mut f32, v: Self::V16) {
        Self::store(p, v)
    }
}
