//! Packers that turn source tensors into compiled payloads (CPU and wgpu).
