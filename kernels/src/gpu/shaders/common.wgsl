// Shared by every ctcache packing shader: bindings, the dispatch index and
// the helpers that keep results exact (see src/gpu/mod.rs).

struct Cfg {
    total: u32,  // invocations that do work
    stride: u32, // invocations per row of the 2-D dispatch grid
    cols: u32,
    rows: u32,
    bs: u32,
    blocks: u32,
    bits: u32,
    cap: u32,    // capacity of the fix-up list
    // Tests only (else 0): an error of up to this much added to every
    // rounded value, as an inexact GPU might make; bytes must not change.
    jitter: f32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read> aux: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
// fix[0] counts flagged elements, fix[1..] lists the first `cap` of them.
@group(0) @binding(3) var<storage, read_write> fix: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> cfg: Cfg;

// A block parameter word meaning "the CPU packs this block".
const SKIP: u32 = 0xffffffffu;
// Values closer than this to a rounding boundary are redone on the CPU.
// GPU products may be fused with the following add or have their
// denormal results flushed; either moves a value by far less than this.
const DELTA: f32 = 0.0009765625;

fn index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * cfg.stride;
}

// NaN, infinity or denormal: inputs a GPU may not treat as IEEE does.
fn special(u: u32) -> bool {
    let e = (u >> 23u) & 0xffu;
    return e == 0xffu || (e == 0u && (u & 0x7fffffu) != 0u);
}

fn flag(i: u32) {
    let slot = atomicAdd(&fix[0], 1u);
    if slot < cfg.cap {
        atomicStore(&fix[slot + 1u], i);
    }
}

// The test error of element e: +-jitter scaled by 0..1.
fn jitter(e: u32) -> f32 {
    let j = cfg.jitter * f32(e % 7u) / 6.0;
    return select(-j, j, (e & 1u) == 0u);
}

// Whether x may round differently to the nearest integer (halves away
// from zero) on the CPU: close to a half, or out of the range where the
// fraction is exact.
fn near_half(x: f32) -> bool {
    let f = x - floor(x);
    return !(abs(x) < 1024.0) || abs(f - 0.5) <= DELTA;
}
