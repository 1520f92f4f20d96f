use half::f16;

use super::activations::quantize_row;
use super::layout::BlockScale;
use super::*;
use crate::weights::ggml_quants::{dequantize, f16_at};

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

const KINDS: [QuantType; 8] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
];

/// Random GGUF blocks of `kind` (`n_blocks` of 32 weights' worth): random bytes, with
/// small positive f16 scales (and offsets of either sign) where the type has them.
fn random_blocks(kind: QuantType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
    let n = n_blocks * BLOCK / kind.block_elems();
    let mut out: Vec<u8> = (0..n * kind.block_bytes())
        .map(|_| lcg(seed) as u8)
        .collect();
    // K-quant weights are d times a 6-bit (Q6_K: 8-bit) scale times u: d a 32nd (128th)
    // of the others'.
    let d_unit = match kind {
        QuantType::Q6_K => 1.0 / 128.0,
        k if k.is_k_quant() => 1.0 / 32.0,
        _ => 1.0,
    };
    let d_at = if kind == QuantType::Q6_K { 208 } else { 0 };
    for block in out.chunks_exact_mut(kind.block_bytes()) {
        let d = f16::from_f32((0.001 + (lcg(seed) % 1000) as f32 * 1e-5) * d_unit);
        block[d_at..d_at + 2].copy_from_slice(&d.to_le_bytes());
        let m = match kind {
            QuantType::Q4_1 | QuantType::Q5_1 => -0.05 + (lcg(seed) % 1000) as f32 * 1e-4,
            // dmin of the K-quants: small and positive (the min is subtracted).
            QuantType::Q4_K | QuantType::Q5_K => (lcg(seed) % 1000) as f32 * 1e-6 * d_unit,
            _ => continue,
        };
        block[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
    }
    out
}

fn random_x(m: usize, k: usize, seed: &mut u64) -> Vec<f32> {
    (0..m * k)
        .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// The f16 offset `m` of the block holding column `c` of a Q4_1 / Q5_1 row.
fn q8_1_offset(kind: QuantType, row_blocks: &[u8], c: usize) -> f32 {
    assert_eq!(ActScales::of(kind), ActScales::Q8_1);
    f16_at(&row_blocks[c / BLOCK * kind.block_bytes()..], 2)
}

/// The K-quants' values are ggml's bit for bit (the same f32 products); the 32-weight
/// types' `d·u + m` differ from ggml's `(u − k)·d` by f32 rounding at most.
#[test]
fn packing_keeps_every_value() {
    let mut seed = 3;
    for kind in KINDS {
        let (rows, cols) = (37, 512);
        let blocks = random_blocks(kind, rows * cols / BLOCK, &mut seed);
        let want = dequantize(kind, &blocks);
        let w = QuantMatrix::from_gguf("w", kind, rows, cols, &blocks).unwrap();
        let mut row = vec![0.0; cols];
        for r in 0..rows {
            w.row_to_f32(r, &mut row);
            for (c, (&a, &b)) in row.iter().zip(&want[r * cols..]).enumerate() {
                let tol = if kind.is_k_quant() {
                    0.0
                } else {
                    1e-6 * b.abs().max(1e-3)
                };
                assert!((a - b).abs() <= tol, "{kind:?} [{r},{c}]: {a} vs {b}");
            }
        }
    }
}

#[test]
fn scales_that_are_not_finite_are_refused() {
    let mut seed = 29;
    for (kind, at) in [
        (QuantType::Q4_K, 0),
        (QuantType::Q5_K, 2),
        (QuantType::Q6_K, 208),
        (QuantType::Q4_1, 0),
    ] {
        // Row 17's second half: the second K-quant super-block.
        let (rows, cols) = (20, 512);
        let mut blocks = random_blocks(kind, rows * cols / BLOCK, &mut seed);
        let row_bytes = cols / kind.block_elems() * kind.block_bytes();
        let bad = 17 * row_bytes + row_bytes / 2 + at;
        blocks[bad..bad + 2].copy_from_slice(&f16::INFINITY.to_le_bytes());
        let err = QuantMatrix::from_gguf("blk.3.w", kind, rows, cols, &blocks).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("`blk.3.w`") && msg.contains("rows 16..20"),
            "{msg}"
        );
    }
    let mut q8 = random_blocks(QuantType::Q8_0, 1, &mut seed);
    q8[..2].copy_from_slice(&f16::from_f32(1000.0).to_le_bytes());
    let err = QuantMatrix::from_gguf("w", QuantType::Q8_0, 1, 32, &q8).unwrap_err();
    assert!(err.to_string().contains("too large for f16"), "{err}");
}

/// A fused weight of parts in different types reads back as its parts, in order, and
/// multiplies as each part alone.
#[test]
fn parts_of_different_types_stack() {
    let mut seed = 23;
    let (cols, m) = (256, 3);
    let shapes = [
        (QuantType::Q4_K, 32),
        (QuantType::Q6_K, 21),
        (QuantType::Q5_0, 19),
    ];
    let blocks: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(kind, rows)| random_blocks(kind, rows * cols / BLOCK, &mut seed))
        .collect();
    let parts: Vec<(QuantType, usize, &[u8])> = shapes
        .iter()
        .zip(&blocks)
        .map(|(&(kind, rows), b)| (kind, rows, b.as_slice()))
        .collect();
    let fused = QuantMatrix::from_parts("qkv", cols, &parts).unwrap();
    assert_eq!((fused.rows, fused.cols), (72, cols));
    let x = random_x(m, cols, &mut seed);
    let mut got = vec![f32::NAN; m * fused.rows];
    matmul(&x, m, &fused, &mut got, 2);
    let (mut row0, mut a, mut b) = (0, vec![0.0; cols], vec![0.0; cols]);
    for &(kind, rows, bytes) in &parts {
        let alone = QuantMatrix::from_gguf("part", kind, rows, cols, bytes).unwrap();
        let mut want = vec![f32::NAN; m * rows];
        matmul(&x, m, &alone, &mut want, 2);
        for r in 0..rows {
            fused.row_to_f32(row0 + r, &mut a);
            alone.row_to_f32(r, &mut b);
            assert_eq!(a, b, "{kind:?} row {r}");
            for i in 0..m {
                assert_eq!(got[i * fused.rows + row0 + r], want[i * rows + r]);
            }
        }
        row0 += rows;
    }
}

#[test]
fn shapes_that_are_not_whole_blocks_are_refused() {
    let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_1, 2, 40, &[0; 60]).unwrap_err();
    assert!(err.to_string().contains("`blk.w`"), "{err}");
    let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_K, 2, 288, &[0; 288]).unwrap_err();
    assert!(err.to_string().contains("`blk.w`"), "{err}");
    let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_1, 2, 32, &[0; 39]).unwrap_err();
    assert!(err.to_string().contains("39 bytes"), "{err}");
}

#[test]
fn simd_activation_quantisation_gives_the_scalar_bytes() {
    let mut seed = 9;
    let mut x = random_x(1, 512, &mut seed);
    x[40] = 0.0;
    x[64..96].fill(0.0);
    x[100] = 2.5;
    x[256..512].fill(0.0);
    for act in [ActScales::Q8_0, ActScales::Q8_1, ActScales::F32] {
        let quantize = |isa| {
            let (mut q, mut sc) = (vec![0i8; 512], vec![BlockScale::default(); 16]);
            quantize_row(&x, &mut q, &mut sc, act, isa);
            (q, sc)
        };
        let want = quantize(Isa::Scalar);
        for isa in Isa::available() {
            assert_eq!(quantize(isa), want, "{act:?} {isa:?}");
        }
    }
}

/// `q·d` is within half a step of `x` (plus, per 32 values, the f16 rounding of `d`:
/// at most 127 steps times 2⁻¹¹); the sums are the `q`s' sums.
#[test]
fn activation_quantisation_is_within_half_a_step() {
    let mut seed = 5;
    let (m, k) = (3, 512);
    let x = random_x(m, k, &mut seed);
    for (act, slack) in [
        (ActScales::Q8_0, 0.5 + 127.0 / 2048.0),
        (ActScales::Q8_1, 0.5 + 127.0 / 2048.0),
        (ActScales::F32, 0.5),
    ] {
        let mut rows = QuantRows::default();
        rows.quantize(&x, m, k, act, Isa::detect());
        for (i, &v) in x.iter().enumerate() {
            let (q, d) = (rows.q[i] as f32, rows.scales[i / BLOCK].d);
            assert!(
                (q * d - v).abs() <= slack * d * 1.0001,
                "{act:?} {i}: {v} vs {}",
                q * d
            );
        }
        for (b, sc) in rows.scales.iter().enumerate() {
            let q = &rows.q[b * BLOCK..(b + 1) * BLOCK];
            let sum = |q: &[i8]| q.iter().map(|&q| q as i32).sum::<i32>();
            assert_eq!((sc.qsum, sc.qsum_low), (sum(q), sum(&q[..BLOCK / 2])));
            let s = sc.d * sc.qsum as f32;
            if act == ActScales::F32 {
                assert_eq!(sc.s, s, "{b}");
            } else {
                assert!((sc.s - s).abs() <= s.abs() * 2f32.powi(-10), "{act:?} {b}");
            }
        }
        // One scale per block, its own: the largest |q| of a block is 127.
        for (b, sc) in rows.scales.iter().enumerate() {
            let q = &rows.q[b * BLOCK..(b + 1) * BLOCK];
            assert_eq!(
                q.iter().map(|q| q.unsigned_abs()).max(),
                Some(127),
                "{act:?} {b}"
            );
            assert!(sc.d > 0.0, "{act:?} {b}");
        }
    }
    let mut zero = QuantRows::default();
    zero.quantize(&[0.0; 256], 1, 256, ActScales::F32, Isa::detect());
    assert!(zero.q.iter().all(|&q| q == 0) && zero.scales[0].d == 0.0);
}

/// Every kernel set this CPU has, against the scalar reference on the same quantised
/// rows: the integer sums are exact, so only float summation order differs.
#[test]
fn kernels_match_the_scalar_reference() {
    let mut seed = 11;
    for kind in KINDS {
        for &(m, n, k) in &[
            (1, 16, 256),
            (3, 21, 512),
            (8, 48, 256),
            (13, 35, 768),
            (5, 29, 512),
            (40, 70, 256),
        ] {
            let blocks = random_blocks(kind, n * k / BLOCK, &mut seed);
            let w = QuantMatrix::from_gguf("w", kind, n, k, &blocks).unwrap();
            let x = random_x(m, k, &mut seed);
            let mut rows = QuantRows::default();
            rows.quantize(&x, m, k, ActScales::of(kind), Isa::detect());
            let mut want = vec![f32::NAN; m * n];
            matmul_quantized(&rows, m, &w, &mut want, 2, Isa::Scalar);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; m * n];
                matmul_quantized(&rows, m, &w, &mut got, 2, isa);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{kind:?} {isa:?} m={m} n={n} k={k} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// Against f64 math on the packed weights' values (the dequantised ones, checked above)
/// and the unquantised activations. The
/// only difference is the activations' rounding: per value at most half a step `d/2`
/// (plus, for the 32-weight types, `d`'s own rounding to f16: 127·2⁻¹¹ steps), and for
/// Q4_1 / Q5_1 per group the f16 roundings of `s` and `d` times the offset `m`
/// (2·2⁻¹¹·|m·s|). The `m = −k·d` types' offsets cancel up to f32 rounding.
#[test]
fn quantised_product_is_within_the_activation_rounding_bound() {
    let mut seed = 17;
    for kind in KINDS {
        let (m, n, k) = (5, 33, 512);
        let blocks = random_blocks(kind, n * k / BLOCK, &mut seed);
        let w = QuantMatrix::from_gguf("w", kind, n, k, &blocks).unwrap();
        let mut wf = vec![0.0; n * k];
        for (r, row) in wf.chunks_exact_mut(k).enumerate() {
            w.row_to_f32(r, row);
        }
        let x = random_x(m, k, &mut seed);
        let mut out = vec![0.0; m * n];
        matmul(&x, m, &w, &mut out, 2);
        let act = ActScales::of(kind);
        let mut rows = QuantRows::default();
        rows.quantize(&x, m, k, act, Isa::detect());
        let step = if act == ActScales::F32 {
            0.5
        } else {
            0.5 + 127.0 / 2048.0
        };
        let row_bytes = k / kind.block_elems() * kind.block_bytes();
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut bound) = (0.0f64, 0.0f64);
                for t in 0..k {
                    let sc = rows.scales[i * (k / BLOCK) + t / BLOCK];
                    exact += x[i * k + t] as f64 * wf[j * k + t] as f64;
                    bound += step * sc.d as f64 * (wf[j * k + t] as f64).abs();
                    if t % BLOCK == 0 && act == ActScales::Q8_1 {
                        let m = q8_1_offset(kind, &blocks[j * row_bytes..], t);
                        bound += (m * sc.s).abs() as f64 * 2f64.powi(-10);
                    }
                }
                let got = out[i * n + j] as f64;
                assert!(
                    (got - exact).abs() <= bound * 1.001 + 1e-5,
                    "{kind:?} [{i},{j}]: {got} vs {exact} (bound {bound})"
                );
            }
        }
    }
}
