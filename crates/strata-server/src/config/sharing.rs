//! `[cluster]` resolved: whether and how this agent shares its cache, checked at start.

use std::net::SocketAddr;
use std::time::Duration;

use strata_types::{Error, Result};

use super::{CacheSharing, ClusterSection, normalize_peer};

/// `[cluster]` resolved for the shared cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Sharing {
    /// Where the members come from.
    pub kind: CacheSharing,
    /// This agent's member id: its address as the others reach it (`http://host:port`).
    pub me: String,
    /// `static`: the members.
    pub peers: Vec<String>,
    /// `slurm`: the agents' port on every node.
    pub slurm_port: u16,
    /// `catalog`: heartbeat period and member TTL.
    pub heartbeat: Duration,
    /// `catalog`: how long a member lives past its last heartbeat.
    pub member_ttl: Duration,
    /// Longest wait for a peer's answer.
    pub peer_timeout: Duration,
    /// `kubernetes`: the agents' headless Service and its namespace.
    pub kube_service: String,
    /// `kubernetes`: the Service's namespace.
    pub kube_namespace: String,
    /// How long metadata is trusted without contact with every member (`cluster::coherence`).
    pub metadata_lease: Duration,
}

impl Sharing {
    /// Resolve the section; `None` when the cache is not shared.
    pub fn resolve(
        c: &ClusterSection,
        peers: &[String],
        api_listen: SocketAddr,
        has_secret: bool,
        catalog_url: &str,
    ) -> Result<Option<Self>> {
        if c.cache == CacheSharing::Off {
            return Ok(None);
        }
        if !has_secret {
            return Err(Error::config(
                "[cluster] cache is shared but there is no cluster secret (STRATA_CLUSTER_SECRET or \
                 [cluster] secret_file): agents would not accept each other's block requests",
            ));
        }
        let slurm_port = c.slurm_port.unwrap_or(api_listen.port());
        let me = match (&c.advertise, c.cache) {
            (Some(a), _) => normalize_peer(a).map_err(|e| e.context("[cluster] advertise"))?,
            (None, CacheSharing::Slurm) => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .ok_or_else(|| Error::config("[cluster] advertise: no host name"))?;
                let short = host.split('.').next().unwrap_or(&host).to_string();
                normalize_peer(&format!("{short}:{slurm_port}"))?
            }
            (None, CacheSharing::Kubernetes) => match std::env::var("POD_IP") {
                Ok(ip) if !ip.trim().is_empty() => {
                    let ip = ip.trim();
                    let host = if ip.contains(':') {
                        format!("[{ip}]")
                    } else {
                        ip.to_string()
                    };
                    normalize_peer(&format!("{host}:{}", api_listen.port()))
                        .map_err(|e| e.context("POD_IP"))?
                }
                _ => {
                    return Err(Error::config(
                        "[cluster] cache = \"kubernetes\": no POD_IP (the downward API's status.podIP) and no \
                         [cluster] advertise: the other agents could not reach this one",
                    ));
                }
            },
            (None, _) if api_listen.ip().is_unspecified() => {
                return Err(Error::config(format!(
                    "[cluster] advertise: the API listens on {api_listen}, which is no address the other \
                     agents can reach; set advertise"
                )));
            }
            (None, _) => format!("http://{api_listen}"),
        };
        match c.cache {
            CacheSharing::Static if !peers.contains(&me) => {
                return Err(Error::config(format!(
                    "[cluster] cache = \"static\": this agent ({me}) is not in [cluster] peers ({}); list every \
                     agent, this one included, or set advertise",
                    peers.join(", ")
                )));
            }
            CacheSharing::Catalog if !catalog_url.starts_with("postgres") => {
                return Err(Error::config(
                    "[cluster] cache = \"catalog\" needs the agents' shared PostgreSQL catalog ([catalog] url)",
                ));
            }
            _ => {}
        }
        let secs = |v: Option<u64>, d: u64| Duration::from_secs(v.unwrap_or(d).max(1));
        let heartbeat = secs(c.heartbeat_secs, 2);
        let member_ttl = secs(c.member_ttl_secs, 10);
        if member_ttl < heartbeat * 2 {
            return Err(Error::config(
                "[cluster] member_ttl_secs must be at least twice heartbeat_secs",
            ));
        }
        Ok(Some(Self {
            kind: c.cache,
            me,
            peers: peers.to_vec(),
            slurm_port,
            heartbeat,
            member_ttl,
            peer_timeout: Duration::from_millis(c.peer_timeout_ms.unwrap_or(10_000).max(100)),
            metadata_lease: Duration::from_millis(c.metadata_lease_ms.unwrap_or(5_000).max(200)),
            kube_service: c
                .kube_service
                .clone()
                .unwrap_or_else(|| "strata-agents".into()),
            kube_namespace: c
                .kube_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| "strata-system".into()),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn section(cache: CacheSharing) -> ClusterSection {
        ClusterSection {
            cache,
            ..Default::default()
        }
    }

    #[test]
    fn sharing_is_refused_without_what_it_needs() {
        let api: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let peers = vec![
            "http://127.0.0.1:7070".to_string(),
            "http://10.0.0.2:7070".into(),
        ];
        let sqlite = "sqlite:///x/catalog.db";
        assert_eq!(
            Sharing::resolve(&section(CacheSharing::Off), &peers, api, false, sqlite).unwrap(),
            None
        );
        let e = Sharing::resolve(&section(CacheSharing::Static), &peers, api, false, sqlite);
        assert!(e.unwrap_err().message().contains("cluster secret"));
        let s = Sharing::resolve(&section(CacheSharing::Static), &peers, api, true, sqlite)
            .unwrap()
            .unwrap();
        assert_eq!(s.me, "http://127.0.0.1:7070");
        assert_eq!(s.peer_timeout, Duration::from_secs(10));
        let other: SocketAddr = "127.0.0.1:7071".parse().unwrap();
        let e = Sharing::resolve(&section(CacheSharing::Static), &peers, other, true, sqlite);
        assert!(
            e.unwrap_err()
                .message()
                .contains("is not in [cluster] peers")
        );
        let wild: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let e = Sharing::resolve(&section(CacheSharing::Static), &peers, wild, true, sqlite);
        assert!(e.unwrap_err().message().contains("set advertise"));
        let mut adv = section(CacheSharing::Static);
        adv.advertise = Some("10.0.0.2:7070".into());
        let s = Sharing::resolve(&adv, &peers, wild, true, sqlite)
            .unwrap()
            .unwrap();
        assert_eq!(s.me, "http://10.0.0.2:7070");
        let e = Sharing::resolve(&section(CacheSharing::Catalog), &peers, api, true, sqlite);
        assert!(e.unwrap_err().message().contains("PostgreSQL"));
        let mut kube = section(CacheSharing::Kubernetes);
        kube.advertise = Some("10.1.2.3:7070".into());
        kube.kube_namespace = Some("strata".into());
        let s = Sharing::resolve(&kube, &[], wild, true, sqlite)
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                s.me.as_str(),
                s.kube_service.as_str(),
                s.kube_namespace.as_str()
            ),
            ("http://10.1.2.3:7070", "strata-agents", "strata")
        );
        let mut fast = section(CacheSharing::Catalog);
        fast.heartbeat_secs = Some(5);
        fast.member_ttl_secs = Some(6);
        let e = Sharing::resolve(&fast, &peers, api, true, "postgres://db/x");
        assert!(e.unwrap_err().message().contains("twice"));
    }
}
