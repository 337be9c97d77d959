//! What a user trusts on day two (issue 29): no command writes over a file
//! it reads, `--json` is JSON, missing output folders are made, and the
//! messages of normal states and mistakes say what happened.

mod harness;

use std::path::Path;

use harness::{ctl_raw, write_model, Daemon, Out};

fn sha(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).unwrap())
}

fn refused_as_input(o: &Out, what: &str) {
    assert_eq!(o.code, 1, "{what}: {o:#?}");
    assert!(
        o.stderr.contains("the output path is the input model"),
        "{what}: {o:#?}"
    );
}

/// `pack`, `strip`, `embed --local` and `materialize --local` refuse an
/// output that is the model, however it is spelled (the same path, `./`,
/// a symbolic link, a hard link): the same file by device and inode.
/// `embed` and `strip` rewrite in place with `--force`.
#[test]
fn no_offline_command_writes_over_the_model_it_reads() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let model = write_model(&dir.join("m.onnx"), 3);
    let before = sha(Path::new(&model));
    std::os::unix::fs::symlink("m.onnx", dir.join("link.onnx")).unwrap();
    std::fs::hard_link(&model, dir.join("hard.onnx")).unwrap();
    let spellings = [
        model.clone(),
        dir.join("./m.onnx").display().to_string(),
        dir.join("link.onnx").display().to_string(),
        dir.join("hard.onnx").display().to_string(),
    ];
    let fmt = ["--format", "gemm.pack_b.f32"];
    for out in &spellings {
        let runs: Vec<(&str, Vec<&str>)> = vec![
            (
                "pack",
                [&["pack", &model, "--initializer", "W", "-o", out][..], &fmt].concat(),
            ),
            ("strip", vec!["strip", &model, "-o", out]),
            (
                "embed",
                [&["embed", &model, "--local", "-o", out][..], &fmt].concat(),
            ),
            (
                "materialize",
                vec!["materialize", &model, "--local", "-o", out],
            ),
        ];
        for (what, args) in runs {
            let o = ctl_raw(&args);
            refused_as_input(&o, &format!("{what} -o {out}"));
            if what != "pack" && what != "materialize" {
                assert!(o.stderr.contains("--force"), "{what}: {o:#?}");
            }
            assert_eq!(sha(Path::new(&model)), before, "{what} -o {out}");
        }
    }
    // --type-out is an output too.
    let payload = dir.join("w.bin").display().to_string();
    let o = ctl_raw(
        &[
            &[
                "pack",
                &model,
                "--initializer",
                "W",
                "-o",
                &payload,
                "--type-out",
            ][..],
            &[model.as_str()],
            &fmt,
        ]
        .concat(),
    );
    refused_as_input(&o, "pack --type-out");
    assert!(!Path::new(&payload).exists());
    // In place when asked.
    let o = ctl_raw(
        &[
            &[
                "--json", "embed", &model, "--local", "-o", &model, "--force",
            ][..],
            &fmt,
        ]
        .concat(),
    )
    .ok();
    assert_eq!(o.json()["entries"], 1, "{o:#?}");
    let o = ctl_raw(&["--json", "strip", &model, "-o", &model, "--force"]).ok();
    assert_eq!(o.json()["removed"], 1, "{o:#?}");
    assert_eq!(sha(Path::new(&model)), before, "strip undid embed");
}

/// Through the daemon: Embed refuses the model as its output unless
/// `--force` (the request's `force`); Materialize refuses it always.
#[test]
fn the_daemon_does_not_write_over_the_model_it_reads() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 4);
    let before = sha(Path::new(&model));
    let link = d.path("work/link.onnx");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let link = link.display().to_string();
    for out in [&model, &link] {
        let o = d.ctl(&["embed", &model, "-o", out]);
        refused_as_input(&o, &format!("embed -o {out}"));
        assert!(o.stderr.contains("--force"), "{o:#?}");
        let o = d.ctl(&["materialize", &model, "-o", out]);
        refused_as_input(&o, &format!("materialize -o {out}"));
        assert_eq!(sha(Path::new(&model)), before);
    }
    let r = d.json(&["embed", &model, "-o", &model, "--force"]);
    assert_eq!(r["via"], "daemon", "{r}");
    assert!(r["entries"].as_u64().unwrap() > 0, "{r}");
    assert_ne!(sha(Path::new(&model)), before);
    d.stop();
}
