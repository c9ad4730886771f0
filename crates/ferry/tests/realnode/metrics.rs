//! The agents' `/metrics`, scraped from each agent pod's address inside the node's network.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use ferry_api::k8s_openapi::api::core::v1::Pod;
use ferry_testbed::VELERO_NAMESPACE;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::node::{AGENT_LABELS, Node};

/// What [`scrape`] read: the `/metrics` text of every ready agent pod, one after the other, and
/// each pod scraped (`name uid restarts`): counters start again with a new container, so a
/// comparison of two scrapes holds only while these stay the same.
pub struct Scraped {
    pub text: String,
    pub agents: Vec<String>,
}

/// Scrapes every ready agent pod.
pub async fn scrape(node: &Node, client: &Client) -> Result<Scraped, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let mut scraped = Scraped { text: String::new(), agents: Vec::new() };
    for pod in pods.list(&ListParams::default().labels(AGENT_LABELS)).await?.items {
        let Some(status) =
            pod.status.as_ref().filter(|_| pod.metadata.deletion_timestamp.is_none())
        else {
            continue;
        };
        let ready =
            status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        let Some(ip) = status.pod_ip.as_deref().filter(|_| ready) else { continue };
        let restarts: i32 =
            status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
        scraped.text.push_str(&http_get(node, SocketAddr::new(ip.parse()?, 8085), "/metrics")?);
        scraped.agents.push(format!(
            "{} {} {restarts}",
            pod.name_any(),
            pod.uid().unwrap_or_default()
        ));
    }
    if scraped.agents.is_empty() {
        return Err("no ready agent pod with an address".into());
    }
    scraped.agents.sort();
    Ok(scraped)
}

/// The sum over `text`'s samples of metric `name` whose labels include every one of `labels`
/// (`key="value"`).
pub fn value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|l| l.split_once("} "))
        .filter(|(set, _)| labels.iter().all(|want| set.split(',').any(|l| l == *want)))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

/// A plain HTTP/1.0 GET to an address inside the node's network.
fn http_get(
    node: &Node,
    addr: SocketAddr,
    path: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut stream = node.cluster.connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}
