//! Node labels through Node Feature Discovery's local feature files: the
//! plugin keeps `<features.d>/rbln` up to date, NFD's worker turns each
//! `name=value` line into a node label. The names carry the `rbln.dev/`
//! namespace, which NFD accepts once listed in its `extraLabelNs`
//! (deploy/kubernetes/README.md).

use std::path::Path;

use crate::inventory::Npu;

/// The feature file's name in NFD's `features.d` directory.
pub const FILE_NAME: &str = "rbln";

/// The labels for these NPUs, sorted by name. Versions and memory are the
/// first device's (a node's NPUs are one product in practice; a mixed node
/// is labelled `rbln.dev/npu.mixed=true`).
pub fn labels(npus: &[Npu]) -> Vec<(String, String)> {
    let mut l = vec![("rbln.dev/npu.present".to_string(), (!npus.is_empty()).to_string()), ("rbln.dev/npu.count".to_string(), npus.len().to_string())];
    if let Some(first) = npus.first() {
        l.push(("rbln.dev/npu.family".into(), "rbln".into()));
        l.push(("rbln.dev/npu.product".into(), "rbln-npu".into()));
        if let Some(v) = &first.hw_version {
            l.push(("rbln.dev/npu.hw-version".into(), v.clone()));
        }
        if let Some(v) = &first.driver_version {
            l.push(("rbln.dev/driver.version".into(), v.clone()));
        }
        if let Some(b) = first.dram_total_bytes {
            l.push(("rbln.dev/npu.memory-mib".into(), (b >> 20).to_string()));
        }
        let mixed = npus.iter().any(|n| n.hw_version != first.hw_version || n.dram_total_bytes != first.dram_total_bytes);
        if mixed {
            l.push(("rbln.dev/npu.mixed".into(), "true".into()));
        }
    }
    l.sort();
    l
}

/// The feature file's text.
pub fn render(npus: &[Npu]) -> String {
    let mut s = String::from("# Written by rbln-device-plugin: the rbln NPUs of this node.\n");
    for (k, v) in labels(npus) {
        s += &format!("{k}={v}\n");
    }
    s
}

/// Replace `<dir>/rbln` atomically (NFD may read it at any time).
pub fn write(dir: &Path, npus: &[Npu]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE_NAME}.tmp"));
    std::fs::write(&tmp, render(npus))?;
    std::fs::rename(tmp, dir.join(FILE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npu(node: u32, hw: &str, dram: u64) -> Npu {
        Npu { node, health: "ok".into(), numa_node: None, hw_version: Some(hw.into()), driver_version: Some("0.2.0".into()), dram_total_bytes: Some(dram) }
    }

    #[test]
    fn labels_of_a_node() {
        let text = render(&[npu(0, "1.5", 512 << 20), npu(1, "1.5", 512 << 20)]);
        for line in [
            "rbln.dev/npu.present=true",
            "rbln.dev/npu.count=2",
            "rbln.dev/npu.product=rbln-npu",
            "rbln.dev/npu.hw-version=1.5",
            "rbln.dev/npu.memory-mib=512",
            "rbln.dev/driver.version=0.2.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("mixed"));
        assert!(render(&[npu(0, "1.5", 512 << 20), npu(1, "1.4", 512 << 20)]).contains("rbln.dev/npu.mixed=true"));
        let none = render(&[]);
        assert!(none.contains("rbln.dev/npu.present=false") && none.contains("rbln.dev/npu.count=0") && !none.contains("product"), "{none}");
    }

    #[test]
    fn the_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("rbln-labels-{}", std::process::id()));
        write(&dir, &[npu(0, "1.5", 1 << 30)]).unwrap();
        write(&dir, &[]).unwrap();
        let text = std::fs::read_to_string(dir.join(FILE_NAME)).unwrap();
        assert!(text.contains("rbln.dev/npu.count=0") && !text.contains("memory"), "{text}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
