// ggml.q8_0 / ggml.q4_0 over a chunk of `blocks` blocks of 32 elements.
// ggml_stats: the first element of largest magnitude of each block;
// ggml_codes: the output byte stream (d then codes per block, `bs` bytes
// per block, `bits` 8 or 4) from the CPU-computed [1/d bits, d as FLOAT16
// or SKIP] per block in `aux`.

// One invocation per block: dst[2i..2i+2] = element bits, special flag.
@compute @workgroup_size(64)
fn ggml_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if i >= cfg.total {
        return;
    }
    let base = i * 32u;
    var best = src[base];
    var mag = best & 0x7fffffffu;
    var sp = 0u;
    for (var j = 0u; j < 32u; j++) {
        let u = src[base + j];
        if special(u) {
            sp = 1u;
        }
        // Magnitudes of finite floats order as their bits do.
        let a = u & 0x7fffffffu;
        if a > mag {
            mag = a;
            best = u;
        }
    }
    dst[2u * i] = best;
    dst[2u * i + 1u] = sp;
}

// Q8_0: round half away from zero of v / d, as int8.
fn q8(e: u32, id: f32) -> u32 {
    let y = bitcast<f32>(src[e]) * id + jitter(e);
    let a = abs(y);
    if near_half(a) {
        flag(e);
    }
    var q = i32(a + 0.5);
    if y < 0.0 {
        q = -q;
    }
    return u32(q) & 0xffu;
}

// Q4_0: min(trunc(v / d + 8.5), 15); boundaries are at integers.
fn q4(e: u32, id: f32) -> u32 {
    let y = bitcast<f32>(src[e]) * id + 8.5 + jitter(e);
    if near_half(y - 0.5) {
        flag(e);
    }
    return min(u32(max(y, 0.0)), 15u);
}

// One invocation per output word of the chunk's byte stream.
@compute @workgroup_size(64)
fn ggml_codes(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if i >= cfg.total {
        return;
    }
    var word = 0u;
    for (var j = 0u; j < 4u; j++) {
        let t = 4u * i + j;
        let b = t / cfg.bs;
        if b >= cfg.blocks {
            break;
        }
        let p = t % cfg.bs;
        let d16 = aux[2u * b + 1u];
        var byte = 0u;
        if d16 != SKIP {
            let id = bitcast<f32>(aux[2u * b]);
            if p < 2u {
                byte = (d16 >> (8u * p)) & 0xffu;
            } else if cfg.bits == 8u {
                byte = q8(b * 32u + p - 2u, id);
            } else {
                let e = b * 32u + p - 2u;
                byte = q4(e, id) | (q4(e + 16u, id) << 4u);
            }
        }
        word |= byte << (8u * j);
    }
    dst[i] = word;
}
