//! Packs side by side hold at most the budget of source copies and payloads
//! (`ctcache_kernels::copies`); a pack larger than the whole budget still
//! runs, alone. Its own test binary: the budget is the process's.

use ctcache::onnx::Model;
use ctcache_kernels::compile::compile;
use ctcache_kernels::{copies, find, Params};
use ctcache_testkit::{unit_f32, xorshift, MatMul};
use prost::Message;

const MIB: u64 = 1 << 20;

#[test]
fn packs_side_by_side_hold_at_most_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    // W: FLOAT[512, 512]: a 1 MiB copy and a Q8_0 payload of 272 KiB per pack.
    let proto = MatMul::new(512, 512, xorshift(3).map(unit_f32)).proto();
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let m = Model::open(&path).unwrap();
    let t = m.initializers().unwrap().remove(0);
    let p = find("ggml.q8_0").unwrap();
    let params = Params::new();

    copies::set_budget(3 * MIB / 2);
    let payloads: Vec<_> = std::thread::scope(|s| {
        let packs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| compile(&m, &t, None, p, &params).unwrap().payload))
            .collect();
        packs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(payloads.windows(2).all(|w| w[0] == w[1]));
    let peak = copies::peak();
    assert!(
        (MIB..=3 * MIB / 2).contains(&peak),
        "{peak} bytes held at once by packs, budget {}",
        3 * MIB / 2
    );

    // Larger than the whole budget: it waits for none and packs alone.
    copies::set_budget(1);
    assert_eq!(
        compile(&m, &t, None, p, &params).unwrap().payload,
        payloads[0]
    );
}
