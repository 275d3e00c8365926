//! The one HTTP helper every probe uses: no proxy, no redirects, bounded in time and
//! in size, and a failure that says what went wrong (for the debug log).

use std::{fmt, time::Duration};

use reqwest::{header::HeaderMap, Method};

/// A metadata answer larger than this is not a metadata answer.
const MAX_BODY: usize = 256 * 1024;

pub(super) struct Http {
    client: reqwest::Client,
    timeout: Duration,
}

/// A 2xx answer.
pub(super) struct Answer {
    pub headers: HeaderMap,
    pub body: String,
}

#[derive(Debug)]
pub(super) enum Kind {
    /// No connection (refused, no route, DNS, or not connected within the time).
    Unreachable(String),
    /// Connected, but no (complete) answer within the time.
    TimedOut,
    /// An answer other than 2xx.
    Status(u16),
    /// An answer that cannot be a metadata answer (too large, not UTF-8).
    Malformed(&'static str),
    /// Anything else: a connection reset, a reply that is not HTTP.
    Broken(String),
}

#[derive(Debug)]
pub(super) struct Failure {
    pub method: Method,
    pub url: String,
    pub kind: Kind,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.method, self.url)?;
        match &self.kind {
            Kind::Unreachable(e) => write!(f, "no connection ({e})"),
            Kind::TimedOut => write!(f, "no answer in time"),
            Kind::Status(s) => write!(f, "answered {s}"),
            Kind::Malformed(why) => write!(f, "answer {why}"),
            Kind::Broken(e) => write!(f, "{e}"),
        }
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.to_string()
    }
}

impl Http {
    /// `timeout` bounds each request from its start to the last byte of the answer;
    /// the connection must be up within three quarters of it, so that a host that
    /// is not there (`Unreachable`) is told apart from one that is silent
    /// (`TimedOut`, which is what AWS's hop limit does to a token answer).
    pub fn new(timeout: Duration) -> Result<Http, String> {
        Http::build(timeout, false)
    }

    /// For a public service (Keeper): the environment's proxy is used, as a user
    /// behind one expects; metadata calls never take it.
    pub fn public(timeout: Duration) -> Result<Http, String> {
        Http::build(timeout, true)
    }

    fn build(timeout: Duration, proxy: bool) -> Result<Http, String> {
        let mut builder = reqwest::Client::builder();
        if !proxy {
            // HTTP_PROXY / HTTPS_PROXY must not reroute metadata calls.
            builder = builder.no_proxy();
        }
        let client = builder
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout * 3 / 4)
            .timeout(timeout)
            .user_agent(concat!("resource-tracker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Http { client, timeout })
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Answer, Failure> {
        self.send(Method::GET, url, headers).await
    }

    pub async fn put(&self, url: &str, headers: &[(&str, &str)]) -> Result<Answer, Failure> {
        self.send(Method::PUT, url, headers).await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, Failure> {
        let fail = |kind| Failure {
            method: method.clone(),
            url: url.to_string(),
            kind,
        };
        let exchange = async {
            let mut req = self
                .client
                .request(method.clone(), url)
                .timeout(self.timeout);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if method == Method::PUT {
                req = req.body("");
            }
            let mut resp = req.send().await.map_err(classify)?;
            let status = resp.status();
            if !status.is_success() {
                return Err(Kind::Status(status.as_u16()));
            }
            let headers = resp.headers().clone();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(classify)? {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(Kind::Malformed("larger than 256 KiB"));
                }
                body.extend_from_slice(&chunk);
            }
            let body = String::from_utf8(body).map_err(|_| Kind::Malformed("not UTF-8"))?;
            Ok(Answer { headers, body })
        };
        // reqwest's own timeout covers the body too; this is the belt to its braces.
        match tokio::time::timeout(self.timeout + Duration::from_millis(50), exchange).await {
            Ok(r) => r.map_err(fail),
            Err(_) => Err(fail(Kind::TimedOut)),
        }
    }
}

fn classify(e: reqwest::Error) -> Kind {
    // The innermost cause says most ("Connection refused"); reqwest's own text
    // repeats the URL.
    let mut why = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        why = s.to_string();
        src = s.source();
    }
    if e.is_connect() {
        Kind::Unreachable(why)
    } else if e.is_timeout() {
        Kind::TimedOut
    } else {
        Kind::Broken(why)
    }
}
