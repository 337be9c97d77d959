// cast.f16: FLOAT -> FLOAT16 bits in integer arithmetic only (so no GPU
// float rule can change a bit): round to nearest even, a NaN keeps its
// sign and top 10 payload bits without forcing the quiet bit (1 when they
// are all zero). The rule of src/fp16.rs.

fn f16_bits(f: u32) -> u32 {
    let sign = (f >> 16u) & 0x8000u;
    let a = f & 0x7fffffffu;
    if a >= 0x7f800000u {
        if a == 0x7f800000u {
            return sign | 0x7c00u;
        }
        let m = (a >> 13u) & 0x3ffu;
        return sign | 0x7c00u | select(m, 1u, m == 0u);
    }
    if a >= 0x47800000u {
        return sign | 0x7c00u;
    }
    if a >= 0x38800000u {
        // Rebias, then round the 13 dropped bits to nearest even; a carry
        // into the exponent (up to infinity) is correct.
        let r = a - (112u << 23u) + 0xfffu + ((a >> 13u) & 1u);
        return sign | (r >> 13u);
    }
    if a < 0x33000000u {
        return sign;
    }
    // Subnormal half: the value in units of 2^-24, nearest even.
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - (a >> 23u);
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rem > half || (rem == half && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}

// One invocation per pair of elements.
@compute @workgroup_size(64)
fn cast_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if i >= cfg.total {
        return;
    }
    dst[i] = f16_bits(src[2u * i]) | (f16_bits(src[2u * i + 1u]) << 16u);
}
