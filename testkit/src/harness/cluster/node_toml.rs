//! A cluster node's `node.toml`, from the cluster's spec.

impl super::LocalCluster {
    /// The node.toml of node `id`.
    pub(super) fn node_toml(&self, id: u64) -> String {
        let s = &self.spec;
        let mut t = format!(
            "socket = {:?}\nram_bytes = {}\nguest_bytes = {}\nprefetch_bytes = {}\nmax_concurrent_loads = {}\nconvert_threads = {}\n",
            self.socket(id),
            s.ram_bytes,
            s.guest_bytes,
            s.prefetch_bytes,
            s.loads,
            s.convert_threads
        );
        if let Some(m) = self.node_metrics(id) {
            t += &format!("metrics = \"{m}\"\n");
        }
        if let Some(ssd) = s.ssd_bytes {
            // Blocks of an eighth of the tier (at most the default 64 MiB):
            // small test tiers stay small on disk, where it is reserved.
            let block = (ssd / 8 / 4096 * 4096).clamp(8192, 64 << 20);
            t += &format!("ssd_dir = {:?}\nssd_bytes = {ssd}\nssd_block_bytes = {block}\n", self.node_ssd(id));
        }
        if !s.remote.is_empty() {
            t += "\n[remote]\n";
            for (k, v) in &s.remote {
                t += &format!("{k} = {v:?}\n");
            }
        }
        if let Some((latency_ms, bw)) = s.throttle {
            t += &format!("\n[throttle]\nlatency_ms = {latency_ms}\nbandwidth_bytes_per_s = {bw}\n");
        }
        let coordinators: Vec<String> = self.coordinators().iter().map(|a| format!("\"{a}\"")).collect();
        t += &format!(
            "\n[cluster]\ncoordinators = [{}]\ncerts = {:?}\ncert_name = \"node-{id}\"\nnode_id = {id}\nadvertise = \"{}\"\nlisten = \"{}\"\n",
            coordinators.join(", "),
            self.certs,
            self.peer_addr(id),
            self.peer_listen(id)
        );
        let mut fabric = String::new();
        if let Some(ms) = s.hold_linger_ms {
            fabric += &format!("hold_linger_ms = {ms}\n");
        }
        if let Some(f) = s.verify_peer_chunks {
            fabric += &format!("verify_peer_chunks = {f:?}\n");
        }
        if s.previous_peer_protocol.contains(&id) {
            fabric += "peer_protocol = 4\n";
        }
        if !fabric.is_empty() {
            t += &format!("\n[cluster.fabric]\n{fabric}");
        }
        // No [[dataset]]: the node opens what the coordinator lists.
        t
    }
}
