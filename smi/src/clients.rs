//! The processes using the NPUs, from the driver's per-file statistics in
//! `/proc/<pid>/fdinfo/<fd>` (docs/uapi.md, "Per-file statistics"): the
//! same source DRM/accel monitors read. Only processes this one may
//! inspect are seen (all of them for root).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

/// One open rbln file (a device context), deduplicated by `drm-client-id`
/// (a dup'd or inherited descriptor is the same client).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    pub pid: u32,
    pub client_id: u64,
    pub device: u32,
    pub host_bytes: u64,
    pub dram_bytes: u64,
    pub buffers: u64,
    pub queues: u64,
    pub submits: u64,
    /// drm-engine-npu: device time of the client's queues, ns.
    pub engine_ns: u64,
}

/// A process's use of one device (all of its clients there).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessUse {
    pub pid: u32,
    pub name: String,
    pub device: u32,
    pub clients: u64,
    pub host_bytes: u64,
    pub dram_bytes: u64,
    pub buffers: u64,
    pub queues: u64,
    pub submits: u64,
    /// drm-engine-npu: device time of the client's queues, ns.
    pub engine_ns: u64,
}

/// Parses one fdinfo file; `None` unless it is an rbln file.
pub fn parse_fdinfo(pid: u32, text: &str) -> Option<Client> {
    let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim(), v.trim())).collect();
    if kv.get("drm-driver") != Some(&"rbln") {
        return None;
    }
    let num = |k: &str| kv.get(k).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u64>().ok());
    // Sizes are "N KiB" (or MiB/GiB, which the convention allows).
    let bytes = |k: &str| {
        let v = kv.get(k)?;
        let mut it = v.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        let unit = match it.next() {
            None => 1,
            Some("KiB") => 1 << 10,
            Some("MiB") => 1 << 20,
            Some("GiB") => 1 << 30,
            Some(_) => return None,
        };
        n.checked_mul(unit)
    };
    Some(Client {
        pid,
        client_id: num("drm-client-id")?,
        device: u32::try_from(num("rbln-device")?).ok()?,
        host_bytes: bytes("drm-total-host").unwrap_or(0),
        dram_bytes: bytes("drm-total-dram").unwrap_or(0),
        buffers: num("rbln-buffers").unwrap_or(0),
        queues: num("rbln-queues").unwrap_or(0),
        submits: num("rbln-submits").unwrap_or(0),
        engine_ns: num("drm-engine-npu").unwrap_or(0),
    })
}

/// Every rbln client under `proc_root` (normally `/proc`), except those of
/// process `skip` (this tool's own open files).
pub fn scan(proc_root: &Path, skip: u32) -> Vec<Client> {
    let mut seen = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else { return Vec::new() };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == skip {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            // Only descriptors of /dev/rbln* (cheap: a readlink).
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if !target.to_str().is_some_and(|t| t.starts_with("/dev/rbln")) {
                continue;
            }
            let info = e.path().join("fdinfo").join(fd.file_name());
            if let Some(c) = std::fs::read_to_string(info).ok().and_then(|t| parse_fdinfo(pid, &t)) {
                seen.entry(c.client_id).or_insert(c);
            }
        }
    }
    seen.into_values().collect()
}

/// The clients summed per process and device, ordered by device and pid.
pub fn by_process(clients: &[Client], proc_root: &Path) -> Vec<ProcessUse> {
    let mut m: BTreeMap<(u32, u32), ProcessUse> = BTreeMap::new();
    for c in clients {
        let p = m.entry((c.device, c.pid)).or_insert_with(|| ProcessUse {
            pid: c.pid,
            name: std::fs::read_to_string(proc_root.join(c.pid.to_string()).join("comm")).map(|s| s.trim().to_string()).unwrap_or_default(),
            device: c.device,
            ..Default::default()
        });
        p.clients += 1;
        p.host_bytes += c.host_bytes;
        p.dram_bytes += c.dram_bytes;
        p.buffers += c.buffers;
        p.queues += c.queues;
        p.submits += c.submits;
        p.engine_ns += c.engine_ns;
    }
    m.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t20\nino:\t601\ndrm-driver:\trbln\ndrm-client-id:\t16\n\
        drm-total-host:\t64 KiB\ndrm-resident-host:\t64 KiB\ndrm-total-dram:\t2 MiB\ndrm-resident-dram:\t2 MiB\n\
        rbln-device:\t1\nrbln-context:\t1\nrbln-buffers:\t2\nrbln-queues:\t1\nrbln-submits:\t3\ndrm-engine-npu:\t1500 ns\n";

    #[test]
    fn parses_the_drivers_keys_and_ignores_other_files() {
        let c = parse_fdinfo(7, SAMPLE).unwrap();
        assert_eq!(c, Client { pid: 7, client_id: 16, device: 1, host_bytes: 65536, dram_bytes: 2 << 20, buffers: 2, queues: 1, submits: 3, engine_ns: 1500 });
        assert_eq!(parse_fdinfo(7, "pos:\t0\nflags:\t02\n"), None);
        assert_eq!(parse_fdinfo(7, &SAMPLE.replace("rbln\n", "amdgpu\n")), None);
        assert_eq!(parse_fdinfo(7, &SAMPLE.replace("drm-client-id:\t16", "drm-client-id:\tx")), None, "a client id is required");
        assert_eq!(parse_fdinfo(7, &SAMPLE.replace("64 KiB", "64 parsecs")).unwrap().host_bytes, 0);
    }

    #[test]
    fn sums_per_process_and_device() {
        let a = parse_fdinfo(7, SAMPLE).unwrap();
        let b = Client { client_id: 17, host_bytes: 4096, ..a.clone() };
        let c = Client { client_id: 18, device: 0, ..a.clone() };
        let p = by_process(&[a, b, c], Path::new("/nonexistent"));
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].device, p[0].clients), (0, 1));
        assert_eq!((p[1].device, p[1].clients, p[1].host_bytes, p[1].submits), (1, 2, 65536 + 4096, 6));
    }
}
