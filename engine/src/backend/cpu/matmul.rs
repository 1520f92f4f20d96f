//! `out = x · wᵀ` on the CPU for weights stored as f32, f16 or bf16 rows `[N, K]`, or as
//! quantised blocks (handed to [`super::quant`]).
//!
//! Few rows (decode): a kernel written once over the CPU's vector lanes (`lanes.rs`)
//! streams each weight row once per tile of activation rows, parallel over N. Many rows (prefill): the `gemm` crate on
//! column chunks of the weight, converted to f32 per chunk into a per-thread buffer so
//! the conversion is amortised over all rows.

use std::cell::RefCell;

use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

use super::lanes::{dispatch, Kernel, Lanes};
use super::quant::{self, QuantMatrix};
use super::simd::{Elem, Isa, SendPtr};

/// Activation row counts below this use the small-M kernel, at or above it `gemm`
/// (measured on 2 Zen 4 cores: the AVX-512 small-M kernel matches `gemm` up to ~64 rows).
pub const GEMM_MIN_ROWS: usize = 64;

/// Weight columns converted to f32 at once on the `gemm` path (bounds the per-thread buffer).
const GEMM_CHUNK_MAX: usize = 128;

/// Storage of a weight matrix.
#[derive(Debug, Clone)]
pub enum WeightData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// GGUF blocks repacked for the integer kernels.
    Quant(QuantMatrix),
}

/// A row-major `[rows, cols]` weight matrix.
#[derive(Debug, Clone)]
pub struct CpuWeight {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
}

impl CpuWeight {
    /// Bytes of its data as stored (quantised panels with their scales).
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => std::mem::size_of_val(v.as_slice()),
            WeightData::F16(v) => std::mem::size_of_val(v.as_slice()),
            WeightData::BF16(v) => std::mem::size_of_val(v.as_slice()),
            WeightData::Quant(q) => q.bytes(),
        }
    }

    /// Copies row `r` into `dst` as f32 (`dst.len() == cols`).
    pub fn row_to_f32(&self, r: usize, dst: &mut [f32]) {
        let range = r * self.cols..(r + 1) * self.cols;
        match &self.data {
            WeightData::F32(v) => dst.copy_from_slice(&v[range]),
            WeightData::F16(v) => v[range].convert_to_f32_slice(dst),
            WeightData::BF16(v) => v[range].convert_to_f32_slice(dst),
            WeightData::Quant(q) => q.row_to_f32(r, dst),
        }
    }
}

/// `out[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N])`. Runs on the current rayon pool.
pub fn matmul(
    x: &[f32],
    m: usize,
    w: &CpuWeight,
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), m * k, "matmul: activation shape");
    assert_eq!(out.len(), m * n, "matmul: output shape");
    if m == 0 || n == 0 {
        return;
    }
    match &w.data {
        WeightData::F32(d) => matmul_typed(x, m, d, n, k, out, threads),
        WeightData::F16(d) => matmul_typed(x, m, d, n, k, out, threads),
        WeightData::BF16(d) => matmul_typed(x, m, d, n, k, out, threads),
        WeightData::Quant(q) => quant::matmul(x, m, q, out, threads),
    }
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(n) {
            for (o, &bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        }
    }
}

fn matmul_typed<T: Elem>(
    x: &[f32],
    m: usize,
    w: &[T],
    n: usize,
    k: usize,
    out: &mut [f32],
    threads: usize,
) {
    let out_ptr = SendPtr(out.as_mut_ptr());
    if m < GEMM_MIN_ROWS {
        let chunk = chunk_rows(n, threads, 4, usize::MAX);
        let isa = Isa::detect();
        (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
            let (n0, n1) = (c * chunk, ((c + 1) * chunk).min(n));
            // SAFETY: each task writes only columns n0..n1 of `out`, disjoint across tasks;
            // the slices' shapes were checked by `matmul`.
            unsafe { small_m(x, m, k, w, n, n0, n1, out_ptr.get(), isa) };
        });
    } else {
        let chunk = chunk_rows(n, threads, 16, GEMM_CHUNK_MAX);
        (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
            let (n0, n1) = (c * chunk, ((c + 1) * chunk).min(n));
            // SAFETY: as above, columns n0..n1 only.
            unsafe { gemm_chunk(x, m, k, &w[n0 * k..n1 * k], n, n0, n1, out_ptr.get()) };
        });
    }
}

/// Weight rows per parallel task: about four tasks per thread, a multiple of `align`.
fn chunk_rows(n: usize, threads: usize, align: usize, max: usize) -> usize {
    let per_task = n.div_ceil(threads.max(1) * 4);
    per_task
        .div_ceil(align)
        .max(1)
        .saturating_mul(align)
        .min(max.max(align))
}

thread_local! {
    /// Per-thread f32 copy of a weight chunk for the `gemm` path.
    static CONVERTED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Columns `n0..n1` of `out` (row stride `ldo`) through `gemm`, single-threaded.
///
/// # Safety
/// `out` points to an `[m, ldo]` f32 matrix; no other thread writes columns `n0..n1`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_chunk<T: Elem>(
    x: &[f32],
    m: usize,
    k: usize,
    w_chunk: &[T],
    ldo: usize,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    let nc = n1 - n0;
    let run = |w: &[f32]| {
        // SAFETY: dst is [m, nc] at `out + n0` with row stride ldo; lhs is x [m, k]
        // row-major; rhs is wᵀ [k, nc]: element (kk, j) at w[j * k + kk].
        unsafe {
            gemm::gemm(
                m,
                nc,
                k,
                out.add(n0),
                1,
                ldo as isize,
                false,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr(),
                k as isize,
                1,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    };
    if let Some(w32) = T::as_f32(w_chunk) {
        run(w32);
        return;
    }
    CONVERTED.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.resize(nc * k, 0.0);
        convert_to_f32(w_chunk, &mut buf, Isa::detect());
        run(&buf);
    });
}

/// Columns `n0..n1` of `out[m, ldo]` for few activation rows.
///
/// # Safety
/// As [`gemm_chunk`]; `isa` is one this CPU runs.
#[allow(clippy::too_many_arguments)]
unsafe fn small_m<T: Elem>(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[T],
    ldo: usize,
    n0: usize,
    n1: usize,
    out: *mut f32,
    isa: Isa,
) {
    let (x, w) = (x.as_ptr(), w.as_ptr());
    dispatch(
        isa,
        SmallM {
            x,
            m,
            k,
            w,
            ldo,
            n0,
            n1,
            out,
        },
    );
}

/// [`small_m`]'s work: tiles of four weight rows by as many activation rows as keep half
/// the registers for accumulators (AVX-512: 4, AVX2: 2, plain: 1); each weight row is
/// streamed once per tile.
struct SmallM<T> {
    x: *const f32,
    m: usize,
    k: usize,
    w: *const T,
    ldo: usize,
    n0: usize,
    n1: usize,
    out: *mut f32,
}

impl<T: Elem> Kernel for SmallM<T> {
    type Output = ();

    #[inline(always)]
    unsafe fn run<L: Lanes>(self) {
        let SmallM {
            x,
            m,
            k,
            w,
            ldo,
            n0,
            n1,
            out,
        } = self;
        let most_rows = (L::REGISTERS / 8).clamp(1, 4);
        let mut j = n0;
        while j < n1 {
            let nr = (n1 - j).min(4);
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(most_rows);
                let (xi, wj, o) = (x.add(i * k), w.add(j * k), out.add(i * ldo + j));
                match (mr, nr) {
                    (4, 4) => tile::<L, T, 4, 4>(xi, k, wj, k, o, ldo),
                    (3, 4) => tile::<L, T, 3, 4>(xi, k, wj, k, o, ldo),
                    (2, 4) => tile::<L, T, 2, 4>(xi, k, wj, k, o, ldo),
                    (1, 4) => tile::<L, T, 1, 4>(xi, k, wj, k, o, ldo),
                    _ => {
                        for r in 0..mr {
                            for c in 0..nr {
                                let (xr, wc) = (xi.add(r * k), wj.add(c * k));
                                tile::<L, T, 1, 1>(xr, k, wc, k, o.add(r * ldo + c), ldo);
                            }
                        }
                    }
                }
                i += mr;
            }
            j += nr;
        }
    }
}

/// `out[i][j] = x_i · w_j` for `MR` activation rows and `NR` weight rows.
#[inline(always)]
unsafe fn tile<L: Lanes, T: Elem, const MR: usize, const NR: usize>(
    x: *const f32,
    ldx: usize,
    w: *const T,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[L::zero(); NR]; MR];
    let kv = k / L::N * L::N;
    let mut kk = 0;
    while kk < kv {
        let mut wv = [L::zero(); NR];
        for (r, v) in wv.iter_mut().enumerate() {
            // The row 8 below: its tile comes two tiles later.
            L::prefetch(w.wrapping_add((r + 8) * k + kk));
            *v = L::load_elem(w.add(r * k + kk));
        }
        for (i, acc_row) in acc.iter_mut().enumerate() {
            let xv = L::load(x.add(i * ldx + kk));
            for (a, v) in acc_row.iter_mut().zip(&wv) {
                *a = L::fmadd(xv, *v, *a);
            }
        }
        kk += L::N;
    }
    for (i, acc_row) in acc.iter().enumerate() {
        for (r, a) in acc_row.iter().enumerate() {
            let mut s = L::hsum(*a);
            for t in kv..k {
                s += *x.add(i * ldx + t) * (*w.add(r * k + t)).to_f32();
            }
            *out.add(i * ldo + r) = s;
        }
    }
}

/// Converts weight elements to f32 (the `gemm` path's per-chunk copy).
fn convert_to_f32<T: Elem>(src: &[T], dst: &mut [f32], isa: Isa) {
    let n = src.len().min(dst.len());
    let (src, dst) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: `isa` was detected; both pointers cover `n` elements.
    unsafe { dispatch(isa, Convert { src, dst, n }) }
}

/// [`convert_to_f32`]'s work.
struct Convert<T> {
    src: *const T,
    dst: *mut f32,
    n: usize,
}

impl<T: Elem> Kernel for Convert<T> {
    type Output = ();

    #[inline(always)]
    unsafe fn run<L: Lanes>(self) {
        let Convert { src, dst, n } = self;
        let nv = n / L::N * L::N;
        for i in (0..nv).step_by(L::N) {
            L::store(dst.add(i), L::load_elem(src.add(i)));
        }
        for i in nv..n {
            *dst.add(i) = (*src.add(i)).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::cpu_has_avx2;
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    fn check(m: usize, n: usize, k: usize, dtype: &str) {
        let mut seed = (m * 1000 + n * 10 + k) as u64;
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let w32: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let (data, w_eff): (WeightData, Vec<f32>) = match dtype {
            "f32" => (WeightData::F32(w32.clone()), w32.clone()),
            "f16" => {
                let h: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
                let e = h.iter().map(|v| v.to_f32()).collect();
                (WeightData::F16(h), e)
            }
            _ => {
                let h: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
                let e = h.iter().map(|v| v.to_f32()).collect();
                (WeightData::BF16(h), e)
            }
        };
        let w = CpuWeight {
            rows: n,
            cols: k,
            data,
        };
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
        let mut out = vec![f32::NAN; m * n];
        matmul(&x, m, &w, Some(&bias), &mut out, 2);
        let want = reference(&x, m, &w_eff, n, k);
        for i in 0..m {
            for j in 0..n {
                let (a, b) = (out[i * n + j], want[i * n + j] + bias[j]);
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{dtype} m={m} n={n} k={k} [{i},{j}]: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn matmul_matches_reference_for_all_shapes_and_dtypes() {
        for dtype in ["f32", "f16", "bf16"] {
            for &(m, n, k) in &[
                (1, 1, 1),
                (1, 7, 13),
                (2, 9, 64),
                (3, 33, 70),
                (15, 40, 24),
                (16, 37, 19),
                (40, 130, 72),
            ] {
                check(m, n, k, dtype);
            }
        }
    }

    #[test]
    fn scalar_fallback_matches_simd() {
        let (m, n, k) = (7, 9, 37);
        let mut seed = 7;
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let w: Vec<f16> = (0..n * k).map(|_| f16::from_f32(lcg(&mut seed))).collect();
        let mut a = vec![0.0; m * n];
        let mut b = vec![0.0; m * n];
        unsafe {
            small_m(&x, m, k, &w, n, 0, n, a.as_mut_ptr(), Isa::Scalar);
            small_m(&x, m, k, &w, n, 0, n, b.as_mut_ptr(), Isa::detect());
        }
        if cpu_has_avx2() {
            let mut c = vec![0.0; m * n];
            unsafe { small_m(&x, m, k, &w, n, 0, n, c.as_mut_ptr(), Isa::Avx2) };
            for (p, q) in a.iter().zip(&c) {
                assert!((p - q).abs() < 1e-5, "avx2: {p} vs {q}");
            }
        }
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "{p} vs {q}");
        }
    }
}
