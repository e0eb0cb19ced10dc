//! Network namespaces for cluster fault tests: one namespace per server, each joined to
//! the host by a veth pair, with routes that a test deletes and adds back to partition
//! the network and heal it; and [`ip`] and [`not_root`], which tucana-cli's partition
//! test shares.
//!
//! The layout of a [`Net`] of N servers: server `i` runs in namespace `tcmp<pid>-<i>`,
//! on `10.215.S.2/24` (S = its subnet number); the host side of its veth pair holds
//! `10.215.S.1/24` and `10.216.S.1/32`, the address at which etcd (on the host) is that
//! server's alone. Inside the namespace, one `/32` route leads to etcd and one `/24`
//! route per other server leads to that server's subnet (the host forwards between
//! veths), so each path can be cut alone:
//!
//! - [`Net::cut_etcd`]: the server's route to etcd goes (strict reverse-path filtering in
//!   every namespace drops etcd's replies too, so the cut is both ways);
//! - [`Net::cut_pair`]: two servers' routes to each other go;
//! - [`Net::link_down`]: the host side of the veth goes down: the server reaches nothing
//!   and nothing (clients included) reaches it;
//! - [`Net::shape`]: both ends of the veth get a token-bucket queue (`tc tbf`): everything
//!   to and from the server (clients, peers, etcd) crosses a slow link that drops what
//!   waits longer than its latency bound.
//!
//! Each has its heal. Clients run on the host and reach every server. Host forwarding
//! (`net.ipv4.ip_forward`) is switched on while a `Net` lives and restored after.
//!
//! Owns the namespaces, links and routes it made (removed when dropped); not the
//! processes run in them (stop them first). Not shared between threads: one test or
//! campaign drives it.

use std::process::Command;

/// Runs `tc ARGS` (in namespace `netns`, if given); its stderr if it failed.
fn tc(netns: Option<&str>, args: &[&str]) -> Result<(), String> {
    let command = match netns {
        Some(name) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", name, "tc"]);
            c
        }
        None => Command::new("tc"),
    };
    run(command, "tc", args)
}

/// Runs `ip ARGS`; its stderr if it failed.
pub fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip"), "ip", args)
}

/// Runs `command` with `args` (`name` for messages); its stderr if it failed.
fn run(mut command: Command, name: &str, args: &[&str]) -> Result<(), String> {
    let output = command
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Why this process cannot make namespaces because it is not root; `None` if it is.
pub fn not_root() -> Option<String> {
    let uid = match Command::new("id").arg("-u").output() {
        Ok(uid) => uid,
        Err(e) => return Some(format!("cannot run id: {e}")),
    };
    let uid = String::from_utf8_lossy(&uid.stdout).trim().to_owned();
    (uid != "0").then(|| format!("euid is {uid}, not 0"))
}

const FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// One server's namespace and veth pair.
pub struct Node {
    /// The namespace's name, for `ip netns exec`.
    pub netns: String,
    host_link: String,
    subnet: u8,
}

impl Node {
    /// Where the server listens (inside its namespace).
    pub fn server_ip(&self) -> String {
        format!("10.215.{}.2", self.subnet)
    }

    fn host_ip(&self) -> String {
        format!("10.215.{}.1", self.subnet)
    }

    /// etcd's address for this server alone (on the host).
    pub fn etcd_ip(&self) -> String {
        format!("10.216.{}.1", self.subnet)
    }

    fn net(&self) -> String {
        format!("10.215.{}.0/24", self.subnet)
    }
}

/// The namespaces of a run's servers; see the module's documentation.
pub struct Net {
    pub nodes: Vec<Node>,
    forward_was: String,
}

impl Net {
    /// Makes `count` namespaces, links, addresses and routes; what failed if this
    /// machine cannot (what was made is removed either way).
    pub fn create(count: usize) -> Result<Net, String> {
        if let Some(why) = not_root() {
            return Err(why);
        }
        let pid = std::process::id();
        let addrs = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        let addrs = String::from_utf8_lossy(&addrs.stdout).into_owned();
        let count_u32 = count as u32;
        let base = (0..240u32)
            .map(|i| (pid + i) % (240 - count_u32) + 1)
            .find(|b| (*b..*b + count_u32).all(|s| !addrs.contains(&format!(" 10.215.{s}."))))
            .ok_or("no free run of 10.215.N.0/24 subnets")?;
        let forward_was = std::fs::read_to_string(FORWARD)
            .map_err(|e| format!("{FORWARD}: {e}"))?
            .trim()
            .to_owned();
        let mut net = Net {
            nodes: (0..count)
                .map(|i| Node {
                    netns: format!("tcmp{pid}-{i}"),
                    host_link: format!("tc{pid}h{i}"),
                    subnet: (base + i as u32) as u8,
                })
                .collect(),
            forward_was,
        };
        // Names with our pid are ours: any a killed process of the same pid left go.
        net.remove();
        if let Err(e) = net.build() {
            net.remove();
            net.nodes.clear();
            return Err(e);
        }
        Ok(net)
    }

    fn build(&self) -> Result<(), String> {
        std::fs::write(FORWARD, "1").map_err(|e| format!("{FORWARD}: {e}"))?;
        let rp_filter = "echo 1 > /proc/sys/net/ipv4/conf/all/rp_filter";
        for node in &self.nodes {
            let inner = node.host_link.replacen('h', "n", 1);
            let (name, host) = (node.netns.as_str(), node.host_link.as_str());
            let host_net = format!("{}/24", node.host_ip());
            let etcd = format!("{}/32", node.etcd_ip());
            let inner_net = format!("{}/24", node.server_ip());
            for args in [
                vec!["netns", "add", name],
                vec!["link", "add", host, "type", "veth", "peer", "name", &inner],
                vec!["link", "set", &inner, "netns", name],
                vec!["addr", "add", &host_net, "dev", host],
                vec!["addr", "add", &etcd, "dev", host],
                vec!["link", "set", host, "up"],
                vec!["-n", name, "link", "set", "lo", "up"],
                vec!["-n", name, "addr", "add", &inner_net, "dev", &inner],
                vec!["-n", name, "link", "set", &inner, "up"],
                vec!["netns", "exec", name, "sh", "-c", rp_filter],
            ] {
                ip(&args)?;
            }
        }
        for i in 0..self.nodes.len() {
            self.heal_etcd(i)?;
            for j in 0..self.nodes.len() {
                if i != j {
                    self.route(i, j, "add")?;
                }
            }
        }
        Ok(())
    }

    fn route(&self, from: usize, to: usize, verb: &str) -> Result<(), String> {
        let (a, b) = (&self.nodes[from], &self.nodes[to]);
        ip(&["-n", &a.netns, "route", verb, &b.net(), "via", &a.host_ip()])
    }

    /// Server `i` no longer reaches etcd, nor etcd it.
    pub fn cut_etcd(&self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        ip(&[
            "-n",
            &node.netns,
            "route",
            "del",
            &format!("{}/32", node.etcd_ip()),
        ])
    }

    pub fn heal_etcd(&self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        ip(&[
            "-n",
            &node.netns,
            "route",
            "add",
            &format!("{}/32", node.etcd_ip()),
            "via",
            &node.host_ip(),
        ])
    }

    /// Servers `i` and `j` no longer reach each other.
    pub fn cut_pair(&self, i: usize, j: usize) -> Result<(), String> {
        self.route(i, j, "del")?;
        self.route(j, i, "del")
    }

    pub fn heal_pair(&self, i: usize, j: usize) -> Result<(), String> {
        self.route(i, j, "add")?;
        self.route(j, i, "add")
    }

    /// Server `i` reaches nothing and nothing reaches it.
    pub fn link_down(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.nodes[i].host_link, "down"])
    }

    pub fn link_up(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.nodes[i].host_link, "up"])
    }

    /// Server `i`'s link carries at most `rate_kbit` kbit/s each way, with a bucket of
    /// `burst_kbit` and packets that would wait longer than `latency_ms` dropped.
    pub fn shape(
        &self,
        i: usize,
        rate_kbit: u64,
        burst_kbit: u64,
        latency_ms: u64,
    ) -> Result<(), String> {
        let node = &self.nodes[i];
        let inner = node.host_link.replacen('h', "n", 1);
        let (rate, burst, latency) = (
            format!("{rate_kbit}kbit"),
            format!("{burst_kbit}kbit"),
            format!("{latency_ms}ms"),
        );
        let tbf = [
            "root", "tbf", "rate", &rate, "burst", &burst, "latency", &latency,
        ];
        tc(
            None,
            &[&["qdisc", "replace", "dev", &node.host_link][..], &tbf].concat(),
        )?;
        tc(
            Some(&node.netns),
            &[&["qdisc", "replace", "dev", &inner][..], &tbf].concat(),
        )
    }

    /// Server `i`'s link at full speed again.
    pub fn unshape(&self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        let inner = node.host_link.replacen('h', "n", 1);
        tc(None, &["qdisc", "del", "dev", &node.host_link, "root"])?;
        tc(Some(&node.netns), &["qdisc", "del", "dev", &inner, "root"])
    }

    /// Deletes the links (one end takes the other and the addresses) and namespaces;
    /// quiet about what is not there.
    fn remove(&self) {
        for node in &self.nodes {
            let _ = ip(&["link", "del", &node.host_link]);
            let _ = ip(&["netns", "del", &node.netns]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
        let _ = std::fs::write(FORWARD, &self.forward_was);
    }
}
