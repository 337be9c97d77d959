//! Keeps libwayland-client's messages off stderr. While wgpu enumerates
//! Vulkan adapters, Mesa's `VK_LAYER_MESA_device_select` layer (wgpu enables
//! `VK_KHR_wayland_surface`, so the layer asks the compositor which GPU it
//! uses) calls `wl_display_connect`; without `XDG_RUNTIME_DIR` (root,
//! services) libwayland prints "error: XDG_RUNTIME_DIR is invalid or not set
//! in the environment." to stderr, on every enumeration, though nothing
//! failed for us: we are no Wayland client, and we rank adapters ourselves.
//! libwayland's own hook (`wl_log_set_handler_client`) sends its messages to
//! the `log` crate at debug instead. Only libwayland's lines are affected,
//! unlike a redirection of fd 2, which would also swallow what other threads
//! write meanwhile.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

/// `wl_log_func_t`: `void (*)(const char *fmt, va_list args)`. A `va_list`
/// argument is passed as a pointer on the x86_64 and aarch64 Linux ABIs; it
/// is never read here.
type Handler = unsafe extern "C" fn(fmt: *const c_char, args: *mut c_void);

/// The message without its arguments: libwayland's connection errors have
/// none; for the others the format string says enough at debug level.
unsafe extern "C" fn to_debug_log(fmt: *const c_char, _args: *mut c_void) {
    if fmt.is_null() {
        return;
    }
    // SAFETY: libwayland passes a NUL-terminated format string.
    let message = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
    log::debug!(
        "libwayland-client (during GPU detection): {}",
        message.trim_end()
    );
}

/// Installs the handler once per process, where libwayland-client exists
/// (where it does not, no layer can print through it).
pub(super) fn route_to_debug_log() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: loading libwayland-client runs no initialisation with
        // preconditions; it is the library the Vulkan layer loads too (one
        // copy per process), so the hook applies to the layer's calls.
        let Ok(lib) = (unsafe { libloading::Library::new("libwayland-client.so.0") }) else {
            return;
        };
        // SAFETY: the symbol has this signature in every libwayland-client
        // since 1.0; the handler is a plain function valid forever.
        if let Ok(set) =
            unsafe { lib.get::<unsafe extern "C" fn(Handler)>(b"wl_log_set_handler_client\0") }
        {
            unsafe { set(to_debug_log) };
        }
        // Stays loaded: the library keeps a pointer to the handler.
        std::mem::forget(lib);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook replaces libwayland's default (a print to stderr): a failing
    /// connect prints nothing. The child process runs without
    /// XDG_RUNTIME_DIR and WAYLAND_DISPLAY, so the connect fails as it does
    /// for a service.
    #[test]
    fn a_failed_wayland_connect_prints_nothing() {
        const CHILD: &str = "CTCACHE_WAYLAND_LOG_CHILD";
        if std::env::var_os(CHILD).is_some() {
            route_to_debug_log();
            // SAFETY: as above; wl_display_connect(NULL) only reads the
            // environment and returns NULL on failure.
            let Ok(lib) = (unsafe { libloading::Library::new("libwayland-client.so.0") }) else {
                return;
            };
            let connect = unsafe {
                lib.get::<unsafe extern "C" fn(*const c_char) -> *mut c_void>(
                    b"wl_display_connect\0",
                )
            }
            .unwrap();
            assert!(unsafe { connect(std::ptr::null()) }.is_null());
            return;
        }
        if unsafe { libloading::Library::new("libwayland-client.so.0") }.is_err() {
            eprintln!("no libwayland-client here: nothing can print through it");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "gpu::wayland_log::tests::a_failed_wayland_connect_prints_nothing",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("WAYLAND_SOCKET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    }
}
