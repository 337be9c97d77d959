//! The transport rules at the edge: before any handler runs, the request's
//! caller must be admitted for the method's use case
//! ([`Caller::admits`](crate::caller::Caller::admits)); a refused request is
//! answered PERMISSION_DENIED without reaching the service. An admitted one
//! must answer within `request_timeout_secs` and within its caller's own
//! deadline (`grpc-timeout`), else it is ended with DEADLINE_EXCEEDED
//! (tonic's own server timeout would say CANCELLED, which clients read as
//! their own doing); a stream that has started answering is not cut. An
//! untrusted uid whose hour of CPU time is spent is answered
//! RESOURCE_EXHAUSTED; an admitted one's handling is its to pay (see
//! `cpu_budget`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http;
use tower::{Layer, Service};

use super::caller;
use crate::caller::Caller;
use crate::cpu_budget::{CpuBudget, Payer};
use crate::error::Error;
use crate::use_case_names::UseCase;

/// The use case of a gRPC method path (`/package.Service/Method`).
fn use_case(path: &str) -> Option<UseCase> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    match service {
        "ctcache.v1.CompiledTensorCache" => UseCase::ALL.into_iter().find(|u| u.name() == method),
        "grpc.health.v1.Health" => Some(UseCase::Health),
        s if s.starts_with("grpc.reflection.") => Some(UseCase::Reflection),
        _ => None,
    }
}

/// Wraps the served routes in [`Guard`].
#[derive(Clone)]
pub(crate) struct GuardLayer {
    pub trusted_uids: Arc<[u32]>,
    /// Longest a handler may take to answer.
    pub deadline: Duration,
    pub cpu: Arc<CpuBudget>,
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            trusted_uids: self.trusted_uids.clone(),
            deadline: self.deadline,
            cpu: self.cpu.clone(),
        }
    }
}

/// Admits or refuses each request before the routes see it, and bounds
/// how long an admitted one may take to answer.
#[derive(Clone)]
pub(crate) struct Guard<S> {
    inner: S,
    trusted_uids: Arc<[u32]>,
    deadline: Duration,
    cpu: Arc<CpuBudget>,
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send>>;

impl<S> Service<http::Request<Body>> for Guard<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let who = caller::from_extensions(req.extensions(), &self.trusted_uids);
        match admit(&who, use_case(req.uri().path()), &self.cpu) {
            Ok(payer) => {
                let caller_limit = grpc_timeout(req.headers()).map(|t| t.saturating_sub(AHEAD));
                let answer = self.inner.call(req);
                let own = self.deadline;
                let limit = caller_limit.map_or(own, |c| c.min(own));
                Box::pin(async move {
                    match paid_within(payer, limit, answer).await {
                        Ok(answered) => answered,
                        Err(_) if limit < own => Ok(tonic::Status::deadline_exceeded(
                            "the caller's deadline passed before the answer",
                        )
                        .into_http::<Body>()),
                        Err(_) => Ok(tonic::Status::deadline_exceeded(no_answer_within(own))
                            .into_http::<Body>()),
                    }
                })
            }
            Err(e) => {
                let refused = tonic::Status::from(e).into_http::<Body>();
                Box::pin(async move { Ok(refused) })
            }
        }
    }
}

/// Admits `who` for `use_case`: its role, then its uid's CPU hour; the
/// payer its handling is charged to (none for a trusted caller). The one
/// admission of the gRPC routes and the descriptor channel's steps.
pub(super) fn admit(
    who: &Caller,
    use_case: Option<UseCase>,
    cpu: &Arc<CpuBudget>,
) -> Result<Option<Payer>, Error> {
    who.admits(use_case)?;
    match who.bounded_uid() {
        Some(uid) => cpu.admit(uid).map(|()| Some(cpu.payer(uid))),
        None => Ok(None),
    }
}

/// Why a request ended unanswered after the daemon's `request_timeout_secs`.
pub(super) fn no_answer_within(limit: Duration) -> String {
    format!(
        "no answer within request_timeout_secs ({} s)",
        limit.as_secs()
    )
}

/// `work`, its CPU charged to `payer`, within `limit`.
pub(super) async fn paid_within<F: Future>(
    payer: Option<Payer>,
    limit: Duration,
    work: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let paid = async move {
        match payer {
            Some(p) => p.serve(work).await,
            None => work.await,
        }
    };
    tokio::time::timeout(limit, paid).await
}

/// How much before a caller's own deadline (`grpc-timeout`) the guard
/// answers DEADLINE_EXCEEDED: tonic's server ends such a call at that very
/// deadline with CANCELLED, which a client reads as its own doing.
const AHEAD: Duration = Duration::from_millis(5);

/// The caller's deadline its `grpc-timeout` header gives (gRPC over HTTP/2:
/// at most 8 digits and a unit of H, M, S, m, u or n); `None` when absent
/// or malformed.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_grpc_timeout_is_read_as_grpc_writes_it() {
        let of = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(of("300m"), Some(Duration::from_millis(300)));
        assert_eq!(of("2S"), Some(Duration::from_secs(2)));
        assert_eq!(of("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(of("99999u"), Some(Duration::from_micros(99999)));
        for bad in ["", "m", "12", "123456789S", "5x", "-5S"] {
            assert_eq!(of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn method_paths_name_their_use_case() {
        assert_eq!(
            use_case("/ctcache.v1.CompiledTensorCache/Put"),
            Some(UseCase::Put)
        );
        assert_eq!(
            use_case("/ctcache.v1.CompiledTensorCache/BatchLookup"),
            Some(UseCase::BatchLookup)
        );
        assert_eq!(
            use_case("/grpc.health.v1.Health/Check"),
            Some(UseCase::Health)
        );
        assert_eq!(use_case("/ctcache.v1.CompiledTensorCache/Nope"), None);
        assert_eq!(use_case("/other.Service/Put"), None);
        assert_eq!(use_case("garbage"), None);
    }

    #[test]
    fn every_rpc_of_the_proto_has_a_use_case() {
        let proto = include_str!("../../../proto/ctcache/v1/ctcache.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .collect();
        assert_eq!(rpcs.len(), UseCase::ALL.len() - 2, "{rpcs:?}");
        for rpc in rpcs {
            let path = format!("/ctcache.v1.CompiledTensorCache/{rpc}");
            assert!(use_case(&path).is_some(), "{rpc} has no use case");
        }
    }
}
