//! How much of a mapping this process holds in memory: for tests that a
//! reader of mapped files gives back what it has read.

/// Resident bytes (`Rss` of /proc/self/smaps) of the mapping that holds
/// `data`'s first byte; panics when no mapping holds it (Linux only).
pub fn resident(data: &[u8]) -> u64 {
    let at = data.as_ptr() as usize;
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = lo <= at && at < hi;
                continue;
            }
        }
        if inside && first == "Rss:" {
            let kib: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .expect("Rss: N kB");
            return kib * 1024;
        }
    }
    panic!("no mapping holds {at:#x}");
}
