// ort.matmul_nbits: W[rows, cols] (a chunk of the source), blocks of `bs`
// rows per column. nbits_stats: min/max of each block; nbits_codes: the
// code words of each block from the CPU-computed reciprocal scale and zero
// point in `aux` ([recip bits, zero point or SKIP] per block).

// Order key of a finite float with both zeros equal, so that strict
// comparisons keep the first of equal values as the CPU does.
fn okey(u: u32) -> i32 {
    if (u & 0x80000000u) != 0u {
        return -i32(u & 0x7fffffffu);
    }
    return i32(u);
}

// One invocation per block (block-major, column fastest): dst[3i..3i+3] =
// min bits, max bits, special flag.
@compute @workgroup_size(64)
fn nbits_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if i >= cfg.total {
        return;
    }
    let c = i % cfg.cols;
    let b = i / cfg.cols;
    let k0 = b * cfg.bs;
    let k1 = min(k0 + cfg.bs, cfg.rows);
    var mn = 0x7f7fffffu; // FLT_MAX
    var mx = 0xff7fffffu; // -FLT_MAX
    var sp = 0u;
    for (var k = k0; k < k1; k++) {
        let u = src[k * cfg.cols + c];
        if special(u) {
            sp = 1u;
        }
        if okey(u) < okey(mn) {
            mn = u;
        }
        if okey(u) > okey(mx) {
            mx = u;
        }
    }
    dst[3u * i] = mn;
    dst[3u * i + 1u] = mx;
    dst[3u * i + 2u] = sp;
}

fn nbits_code(k: u32, c: u32, r: f32, z: f32, kmax: f32) -> u32 {
    let e = k * cfg.cols + c;
    let x = bitcast<f32>(src[e]) * r + z + jitter(e);
    if near_half(x) {
        flag(e);
    }
    // The mask keeps a garbage code of a flagged element in its own bits.
    return u32(clamp(x, 0.0, kmax) + 0.5) & u32(kmax);
}

// One invocation per output word: column fastest, then word of the blob,
// then block. dst is [cols][blocks][bs * bits / 32] words.
@compute @workgroup_size(64)
fn nbits_codes(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if i >= cfg.total {
        return;
    }
    let wpb = cfg.bs * cfg.bits / 32u;
    let c = i % cfg.cols;
    let rest = i / cfg.cols;
    let w = rest % wpb;
    let b = rest / wpb;
    let p = 2u * (b * cfg.cols + c);
    let zp = aux[p + 1u];
    var word = 0u;
    if zp != SKIP {
        let r = bitcast<f32>(aux[p]);
        let z = f32(zp);
        let kmax = f32((1u << cfg.bits) - 1u);
        let per = 32u / cfg.bits;
        let k0 = b * cfg.bs + w * per;
        for (var j = 0u; j < per; j++) {
            let k = k0 + j;
            if k < cfg.rows {
                word |= nbits_code(k, c, r, z, kmax) << (j * cfg.bits);
            }
        }
    }
    dst[(c * cfg.blocks + b) * wpb + w] = word;
}
