//! A pack's share of the budget handed to the caller with the payload
//! (`compile_held`, shrunk to the payload) keeps counting until the caller
//! drops it: the next pack waits for it, so workers storing payloads hold
//! no more than the budget.
//! Its own test binary: the budget is the process's.

use std::sync::mpsc;
use std::time::Duration;

use ctcache::onnx::Model;
use ctcache_kernels::compile::{compile, compile_held, BackendChoice};
use ctcache_kernels::{copies, find, Params};
use ctcache_testkit::{unit_f32, xorshift, MatMul};
use prost::Message;

const MIB: u64 = 1 << 20;

#[test]
fn a_held_share_keeps_the_next_pack_waiting_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    // W: FLOAT[512, 512]: a 1 MiB copy and a Q8_0 payload of 272 KiB per pack.
    let proto = MatMul::new(512, 512, xorshift(5).map(unit_f32)).proto();
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let m = Model::open(&path).unwrap();
    let t = m.initializers().unwrap().remove(0);
    let p = find("ggml.q8_0").unwrap();
    let params = Params::new();
    // One pack fits (1.27 MiB); a second beside a held payload does not.
    let budget = 7 * MIB / 5;
    copies::set_budget(budget);

    let (held, share) = compile_held(&m, &t, None, p, &params, BackendChoice::Cpu).unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = compile(&m, &t, None, p, &params).unwrap();
            done.send(c.payload).unwrap();
        });
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second pack ran beside a payload whose share is still held"
        );
        drop(share);
        let second = finished.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(second, held.payload);
    });
    assert!(copies::peak() <= budget, "peak {}", copies::peak());
}
