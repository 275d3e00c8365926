//! Spare Cores Keeper: the cheapest server of its public catalogue that fits a
//! recommendation, and the current server's price. Asked only on request
//! (`--recommend-server`); every failure is one line in the answer, never an error
//! of the run.

use std::time::Duration;

use serde::Deserialize;

use super::http::Http;
use crate::model::{
    stats::{Recommendation, ServerAdvice, ServerOffer},
    CloudInfo,
};

/// Keeper's own clients wait this long (the Python package's default).
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
struct Server {
    vendor_id: String,
    server_id: String,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    vcpus: Option<f64>,
    /// MiB.
    #[serde(default)]
    memory_amount: Option<f64>,
    #[serde(default)]
    gpu_count: Option<f64>,
    /// MiB.
    #[serde(default)]
    gpu_memory_total: Option<f64>,
    #[serde(default)]
    min_price_ondemand: Option<f64>,
}

#[derive(Deserialize)]
struct Price {
    #[serde(default)]
    region_id: Option<String>,
    #[serde(default)]
    allocation: Option<String>,
    #[serde(default)]
    operating_system: Option<String>,
    #[serde(default)]
    price: Option<f64>,
}

/// The search's query string: Keeper takes memory and VRAM in GB.
pub fn query(rec: &Recommendation) -> String {
    let gb = |mib: u64| {
        // Rounded up: the server must hold at least the recommendation.
        let g = (mib as f64 / 1024.0 * 100.0).ceil() / 100.0;
        if g.fract() == 0.0 {
            format!("{g:.0}")
        } else {
            format!("{g}")
        }
    };
    let mut q = format!("vcpus_min={}&memory_min={}", rec.cpu, gb(rec.memory_mib));
    if rec.gpu > 0 {
        q.push_str(&format!("&gpu_min={}", rec.gpu));
    }
    if rec.vram_mib > 0 {
        q.push_str(&format!("&gpu_memory_total={}", gb(rec.vram_mib)));
    }
    q.push_str("&order_by=min_price_ondemand&order_dir=asc&limit=1");
    q
}

/// Path segments are ids from discovery: anything but the characters ids use is
/// refused rather than escaped.
fn segment(s: &str) -> Option<&str> {
    (!s.is_empty()
        && !s.chars().all(|c| c == '.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    .then_some(s)
}

async fn get_json<T: for<'de> Deserialize<'de>>(h: &Http, url: &str) -> Result<T, String> {
    let a = h
        .get(url, &[("X-Application-ID", "resource-tracker")])
        .await
        .map_err(String::from)?;
    serde_json::from_str(&a.body).map_err(|e| format!("GET {url}: unexpected answer ({e})"))
}

/// The current server's on-demand Linux price: in its region, else its cheapest
/// listed region.
async fn current_price(h: &Http, base: &str, cloud: &CloudInfo) -> Option<f64> {
    let vendor = segment(&cloud.cloud_vendor_id)?;
    let kind = segment(cloud.cloud_instance_type.as_deref()?)?;
    let url = format!("{base}/server/{vendor}/{kind}/prices");
    let prices: Vec<Price> = match get_json(h, &url).await {
        Ok(p) => p,
        Err(e) => {
            log::info!("Keeper: {e}");
            return None;
        }
    };
    let ondemand = |p: &&Price| {
        p.allocation.as_deref() == Some("ondemand")
            && p.operating_system.as_deref().is_none_or(|o| o == "Linux")
            && p.price.is_some()
    };
    let region = cloud.cloud_region_id.as_deref();
    prices
        .iter()
        .filter(ondemand)
        .find(|p| region.is_some() && p.region_id.as_deref() == region)
        .or_else(|| {
            prices
                .iter()
                .filter(ondemand)
                .min_by(|a, b| a.price.unwrap_or(0.0).total_cmp(&b.price.unwrap_or(0.0)))
        })
        .and_then(|p| p.price)
}

async fn ask(
    base: &str,
    rec: &Recommendation,
    cloud: Option<&CloudInfo>,
    duration_secs: f64,
) -> ServerAdvice {
    let q = query(rec);
    let mut advice = ServerAdvice {
        query: q.clone(),
        ..Default::default()
    };
    let h = match Http::public(TIMEOUT) {
        Ok(h) => h,
        Err(e) => {
            advice.error = Some(e);
            return advice;
        }
    };
    let url = format!("{base}/servers?{q}");
    let found: Vec<Server> = match get_json(&h, &url).await {
        Ok(s) => s,
        Err(e) => {
            advice.error = Some(e);
            return advice;
        }
    };
    let Some(s) = found.into_iter().next() else {
        advice.error = Some("no server in Keeper's catalogue fits".into());
        return advice;
    };
    let Some(price) = s.min_price_ondemand.filter(|p| p.is_finite() && *p >= 0.0) else {
        advice.error = Some(format!(
            "Keeper lists {}/{} without an on-demand price",
            s.vendor_id, s.server_id
        ));
        return advice;
    };
    let hours = duration_secs.max(0.0) / 3600.0;
    let run_cost = price * hours;
    advice.run_cost_usd = Some(run_cost);
    advice.server = Some(ServerOffer {
        name: s
            .display_name
            .or(s.name)
            .unwrap_or_else(|| s.server_id.clone()),
        vendor_id: s.vendor_id,
        server_id: s.server_id,
        vcpus: s.vcpus,
        memory_gib: s.memory_amount.map(|m| m / 1024.0),
        gpu_count: s.gpu_count,
        gpu_memory_gib: s.gpu_memory_total.map(|m| m / 1024.0),
        price_usd_per_hour: price,
    });
    if let Some(cur) = match cloud {
        Some(c) => current_price(&h, base, c).await,
        None => None,
    } {
        let cur_cost = cur * hours;
        advice.current_price_usd_per_hour = Some(cur);
        advice.current_run_cost_usd = Some(cur_cost);
        if cur_cost > 0.0 {
            advice.savings_pct = Some(((cur_cost - run_cost) / cur_cost * 1e4).round() / 100.0);
        }
    }
    advice
}

/// Asks Keeper at `base` on a thread of its own (the caller may be inside another
/// runtime); bounded by the requests' timeouts.
pub fn advise(
    base: &str,
    rec: &Recommendation,
    cloud: Option<&CloudInfo>,
    duration_secs: f64,
) -> ServerAdvice {
    let fail = |e: String| ServerAdvice {
        query: query(rec),
        error: Some(e),
        ..Default::default()
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            super::runtime::on_own_runtime(ask(base, rec, cloud, duration_secs))
                .unwrap_or_else(|e| fail(format!("Keeper: no runtime ({e})")))
        })
        .join()
        .unwrap_or_else(|_| fail("Keeper: the request's thread failed".into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_in_keepers_units() {
        let rec = Recommendation {
            cpu: 2,
            cpu_slowdown: 1.0,
            predicted_duration_secs: 1.0,
            cpu_within_5pct: 2,
            memory_mib: 3072,
            gpu: 1,
            vram_mib: 512,
            memory_source: "rss",
            allocation: "dedicated",
            ..Default::default()
        };
        assert_eq!(
            query(&rec),
            "vcpus_min=2&memory_min=3&gpu_min=1&gpu_memory_total=0.5&order_by=min_price_ondemand&order_dir=asc&limit=1"
        );
        assert_eq!(segment("m5.large"), Some("m5.large"));
        assert_eq!(segment("../x"), None);
        assert_eq!(segment(".."), None);
        assert_eq!(segment("a/b"), None);
    }
}
