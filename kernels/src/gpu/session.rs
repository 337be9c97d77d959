//! The buffers of one pack call and the dispatch-and-read-back round trip
//! every driver uses: upload, run one kernel, copy its output and the
//! fix-up list to a mappable buffer, wait, read.

use std::sync::mpsc;

use super::backend::{GpuBackend, Kernel, WORKGROUP};
use super::GpuError;

/// Kernel settings (the shaders' `Cfg` less what [`Session::run`] fills).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cfg {
    pub cols: u32,
    pub rows: u32,
    pub bs: u32,
    pub blocks: u32,
    pub bits: u32,
}

/// Elements a kernel flagged for the CPU; `overflow` when there were more
/// than the list holds (the caller then redoes the whole chunk).
#[derive(Debug, Default)]
pub(super) struct Fixes {
    pub overflow: bool,
    pub list: Vec<u32>,
}

pub(super) struct Session<'g> {
    gpu: &'g GpuBackend,
    src: wgpu::Buffer,
    aux: wgpu::Buffer,
    dst: wgpu::Buffer,
    fix: wgpu::Buffer,
    cfg: wgpu::Buffer,
    read: wgpu::Buffer,
    bind: wgpu::BindGroup,
    fix_cap: u32,
    fix_off: u64,
    scopes: Vec<wgpu::ErrorScopeGuard>,
}

#[cfg(test)]
thread_local! {
    /// The shaders' `jitter` for packs on this thread (tests only).
    pub(super) static JITTER: std::cell::Cell<f32> = const { std::cell::Cell::new(0.0) };
}

fn jitter() -> f32 {
    #[cfg(test)]
    return JITTER.with(|j| j.get());
    #[cfg(not(test))]
    0.0
}

fn entry(binding: u32, b: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: b.as_entire_binding(),
    }
}

fn round4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

impl<'g> Session<'g> {
    /// Buffers for at most `src`, `aux` and `dst` bytes per run and
    /// `fix_cap` flagged elements.
    pub fn new(
        gpu: &'g GpuBackend,
        src: u64,
        aux: u64,
        dst: u64,
        fix_cap: u32,
    ) -> Result<Session<'g>, GpuError> {
        let d = &gpu.device;
        // Errors of this call's device work land here (scopes are per
        // thread), not in the process-wide handler.
        let scopes = vec![
            d.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            d.push_error_scope(wgpu::ErrorFilter::Validation),
            d.push_error_scope(wgpu::ErrorFilter::Internal),
        ];
        let buffer = |label, size: u64, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: round4(size).max(16),
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        let src = buffer("src", src, U::STORAGE | U::COPY_DST);
        let aux = buffer("aux", aux, U::STORAGE | U::COPY_DST);
        let dst_buf = buffer("dst", dst, U::STORAGE | U::COPY_SRC);
        let fix_bytes = 4 * (1 + u64::from(fix_cap));
        let fix = buffer("fix", fix_bytes, U::STORAGE | U::COPY_SRC | U::COPY_DST);
        let cfg = buffer("cfg", 48, U::UNIFORM | U::COPY_DST);
        let fix_off = round4(dst).max(16).div_ceil(8) * 8;
        let read = buffer("read", fix_off + fix.size(), U::MAP_READ | U::COPY_DST);
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("ctcache"),
            layout: &gpu.layout,
            entries: &[
                entry(0, &src),
                entry(1, &aux),
                entry(2, &dst_buf),
                entry(3, &fix),
                entry(4, &cfg),
            ],
        });
        Ok(Session {
            gpu,
            src,
            aux,
            dst: dst_buf,
            fix,
            cfg,
            read,
            bind,
            fix_cap,
            fix_off,
            scopes,
        })
    }

    pub fn write_src(&self, data: &[u8]) {
        self.gpu.queue.write_buffer(&self.src, 0, data);
    }

    pub fn write_aux(&self, data: &[u8]) {
        self.gpu.queue.write_buffer(&self.aux, 0, data);
    }

    /// Runs `kernel` over `total` invocations, then calls `read` with the
    /// first `dst_len` bytes of its output and its fix-up list.
    pub fn run<R>(
        &self,
        kernel: Kernel,
        cfg: Cfg,
        total: u32,
        dst_len: u64,
        read: impl FnOnce(&[u8], Fixes) -> R,
    ) -> Result<R, GpuError> {
        let g = self.gpu;
        let groups = total.div_ceil(WORKGROUP).max(1);
        let gx = groups.min(g.max_groups);
        let gy = groups.div_ceil(gx);
        if gy > g.max_groups {
            return Err(GpuError::Device(format!(
                "{total} invocations exceed the dispatch grid"
            )));
        }
        let words = [
            total,
            gx * WORKGROUP,
            cfg.cols,
            cfg.rows,
            cfg.bs,
            cfg.blocks,
            cfg.bits,
            self.fix_cap,
            jitter().to_bits(),
            0,
            0,
            0,
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        g.queue.write_buffer(&self.cfg, 0, &bytes);
        let mut enc = g
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.clear_buffer(&self.fix, 0, Some(4));
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(g.pipeline(kernel));
            pass.set_bind_group(0, &self.bind, &[]);
            pass.dispatch_workgroups(gx, gy, 1);
        }
        let dst_copy = round4(dst_len);
        if dst_copy > 0 {
            enc.copy_buffer_to_buffer(&self.dst, 0, &self.read, 0, dst_copy);
        }
        let fix_bytes = self.fix.size();
        enc.copy_buffer_to_buffer(&self.fix, 0, &self.read, self.fix_off, fix_bytes);
        g.queue.submit([enc.finish()]);
        let end = self.fix_off + fix_bytes;
        let (tx, rx) = mpsc::channel();
        self.read.map_async(wgpu::MapMode::Read, 0..end, move |r| {
            let _ = tx.send(r);
        });
        g.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(GpuError::Device(format!("read-back failed: {e}"))),
            Err(_) => return Err(GpuError::Device("read-back never completed".into())),
        }
        let result = {
            let view = self
                .read
                .get_mapped_range(0..end)
                .map_err(|e| GpuError::Device(e.to_string()))?;
            let u32_at =
                |off: usize| u32::from_le_bytes(view[off..off + 4].try_into().expect("4 bytes"));
            let fo = self.fix_off as usize;
            let count = u32_at(fo);
            let kept = count.min(self.fix_cap) as usize;
            let fixes = Fixes {
                overflow: count > self.fix_cap,
                list: (0..kept).map(|i| u32_at(fo + 4 + 4 * i)).collect(),
            };
            read(&view[..dst_len as usize], fixes)
        };
        self.read.unmap();
        Ok(result)
    }

    /// Ends the session: the first device error of its work, if any.
    pub fn finish(mut self) -> Result<(), GpuError> {
        let mut first = None;
        while let Some(scope) = self.scopes.pop() {
            if let Some(e) = pollster::block_on(scope.pop()) {
                first.get_or_insert(e.to_string());
            }
        }
        match first {
            Some(e) => Err(GpuError::Device(e)),
            None => Ok(()),
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // wgpu requires scopes to be popped in reverse order of creation.
        while let Some(scope) = self.scopes.pop() {
            drop(scope);
        }
    }
}
