//! The DevicePlugin gRPC service the kubelet calls.

use std::collections::BTreeMap;
use std::pin::Pin;

use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::api::{self, device_plugin_server::DevicePlugin};
use crate::inventory::{node_of, Npu, Roots};
use crate::{HEALTHY, UNHEALTHY};

/// Serves the kubelet from the latest inventory (kept current by the
/// health poller through `devices`).
pub struct Plugin {
    pub devices: watch::Receiver<Vec<Npu>>,
    pub roots: Roots,
}

/// The options this plugin registers with.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// The kubelet's view of the NPUs.
pub fn list(npus: &[Npu]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: npus
            .iter()
            .map(|n| api::Device {
                id: n.id(),
                health: if n.healthy() { HEALTHY } else { UNHEALTHY }.into(),
                topology: n.numa_node.map(|id| api::TopologyInfo { nodes: vec![api::NumaNode { id }] }),
            })
            .collect(),
    }
}

/// What a container given `ids` gets: their device nodes (read-write) and
/// RBLN_VISIBLE_DEVICES naming them, so that device 0 of every rbln API in
/// the container is the first of them.
pub fn allocate(ids: &[String], npus: &[Npu], roots: &Roots) -> Result<api::ContainerAllocateResponse, Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument("an allocation of no devices"));
    }
    let mut nodes = Vec::new();
    for id in ids {
        let node = node_of(id).ok_or_else(|| Status::invalid_argument(format!("{id:?} is not an rbln device ID (rblnN)")))?;
        if !npus.iter().any(|n| n.node == node) {
            return Err(Status::invalid_argument(format!("{id} is not a device of this node")));
        }
        if nodes.contains(&node) {
            return Err(Status::invalid_argument(format!("{id} is listed twice")));
        }
        nodes.push(node);
    }
    let visible = nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
    Ok(api::ContainerAllocateResponse {
        envs: BTreeMap::from([(rbln_umd::VISIBLE_DEVICES_ENV.to_string(), visible)]).into_iter().collect(),
        devices: nodes
            .iter()
            .map(|&n| {
                let path = roots.dev.join(format!("rbln{n}")).display().to_string();
                api::DeviceSpec { container_path: path.clone(), host_path: path, permissions: "rw".into() }
            })
            .collect(),
        ..Default::default()
    })
}

/// `size` devices out of `available`, `must` first; then healthy before
/// unhealthy, devices on the NUMA node of those already chosen, lowest
/// index. Unknown IDs are ignored; fewer than `size` when there are not
/// enough.
pub fn preferred(available: &[String], must: &[String], size: usize, npus: &[Npu]) -> Vec<String> {
    let mut chosen: Vec<String> = must.iter().take(size).cloned().collect();
    let numa_of = |id: &str| node_of(id).and_then(|n| npus.iter().find(|d| d.node == n)).and_then(|d| d.numa_node);
    let want_numa = chosen.first().and_then(|id| numa_of(id));
    let mut rest: Vec<(bool, bool, u32, String)> = available
        .iter()
        .filter(|id| !chosen.contains(id))
        .filter_map(|id| {
            let node = node_of(id)?;
            let npu = npus.iter().find(|d| d.node == node)?;
            Some((!npu.healthy(), want_numa.is_some() && npu.numa_node != want_numa, node, id.clone()))
        })
        .collect();
    rest.sort();
    chosen.extend(rest.into_iter().map(|r| r.3).take(size.saturating_sub(chosen.len())));
    chosen
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(&self, _: Request<api::Empty>) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    /// The list now, then again at every change of the inventory.
    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<ListStream>, Status> {
        let stream = tokio_stream::wrappers::WatchStream::new(self.devices.clone()).map(|npus| Ok(list(&npus)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let npus = self.devices.borrow().clone();
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).map_err(|_| Status::invalid_argument(format!("allocation size {}", c.allocation_size)))?;
                Ok(api::ContainerPreferredAllocationResponse { device_i_ds: preferred(&c.available_device_i_ds, &c.must_include_device_i_ds, size, &npus) })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(api::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, req: Request<api::AllocateRequest>) -> Result<Response<api::AllocateResponse>, Status> {
        let npus = self.devices.borrow().clone();
        let container_responses =
            req.into_inner().container_requests.iter().map(|c| allocate(&c.devices_ids, &npus, &self.roots)).collect::<Result<_, Status>>()?;
        Ok(Response::new(api::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(&self, _: Request<api::PreStartContainerRequest>) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npu(node: u32, health: &str, numa: Option<i64>) -> Npu {
        Npu { node, health: health.into(), numa_node: numa, hw_version: Some("1.4".into()), driver_version: Some("0.2.0".into()), dram_total_bytes: Some(512 << 20) }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allocation_gives_nodes_and_visible_devices() {
        let npus = [npu(0, "ok", None), npu(1, "ok", None), npu(3, "faulted", None)];
        let roots = Roots::default();
        let r = allocate(&ids(&["rbln3", "rbln1"]), &npus, &roots).unwrap();
        assert_eq!(r.envs.get("RBLN_VISIBLE_DEVICES").map(String::as_str), Some("3,1"));
        assert_eq!(r.devices.len(), 2);
        assert_eq!((r.devices[0].host_path.as_str(), r.devices[0].container_path.as_str(), r.devices[0].permissions.as_str()), ("/dev/rbln3", "/dev/rbln3", "rw"));
        for bad in [&["rbln7"][..], &["gpu0"], &["rbln"], &["rbln1", "rbln1"], &[]] {
            let e = allocate(&ids(bad), &npus, &roots).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn preferred_allocation_keeps_must_and_prefers_healthy_local() {
        let npus = [npu(0, "faulted", Some(0)), npu(1, "ok", Some(1)), npu(2, "ok", Some(0)), npu(3, "ok", Some(1))];
        let all = ids(&["rbln0", "rbln1", "rbln2", "rbln3"]);
        assert_eq!(preferred(&all, &[], 1, &npus), ids(&["rbln1"]), "healthy first, lowest index");
        assert_eq!(preferred(&all, &ids(&["rbln2"]), 2, &npus), ids(&["rbln2", "rbln1"]), "healthy over local when the local one is faulted");
        assert_eq!(preferred(&all, &ids(&["rbln3"]), 2, &npus), ids(&["rbln3", "rbln1"]), "the same NUMA node");
        assert_eq!(preferred(&all, &[], 9, &npus).len(), 4, "no more than available");
        assert_eq!(preferred(&ids(&["bogus", "rbln2"]), &[], 2, &npus), ids(&["rbln2"]));
    }

    #[test]
    fn list_reports_health_and_topology() {
        let l = list(&[npu(0, "ok", Some(1)), npu(1, "lost", None)]);
        assert_eq!(l.devices[0].health, "Healthy");
        assert_eq!(l.devices[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(l.devices[1].health, "Unhealthy");
        assert!(l.devices[1].topology.is_none());
    }
}
