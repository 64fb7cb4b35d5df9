//! [`ApiError`]: every non-200 answer of the client API, as
//! `{"error":{"code":"...","message":"..."}}` with the matching status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use policy::RunReport;
use serde_json::{json, Value};

use crate::daemon::registry::Violation;

/// An error answer of the client API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 400 `bad_request`: the body is not the JSON asked for.
    #[error("{0}")]
    BadRequest(String),
    /// 400 `invalid_args`: the args do not match the skill's schema.
    #[error("args do not match the schema of skill \"{skill}\"")]
    InvalidArgs {
        /// The skill.
        skill: String,
        /// What does not match.
        violations: Vec<Violation>,
    },
    /// 403 `denied`: the caller may not run the skill; `reason` is the
    /// stable code ([`policy::DenyReason`]) and is also in the body.
    #[error("{message}")]
    Denied {
        /// The reason code.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// 403 `forbidden`: the caller may not use this route (the audit trail).
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`: no such skill or route.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 408 `request_timeout`: the body did not arrive in time.
    #[error("request body not received in time")]
    RequestTimeout,
    /// 413 `payload_too_large`.
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    /// 415 `unsupported_encoding`: the body has a `Content-Encoding` other
    /// than `identity` (the coding, as sent, bounded).
    #[error("Content-Encoding {0:?} is not supported: send the body as is (identity)")]
    UnsupportedEncoding(String),
    /// 431 `head_too_large`: the request line and headers are over the
    /// limit (answered by the connection, before any route).
    #[error("request head (request line and headers) over {0} bytes")]
    HeadTooLarge(usize),
    /// 500 `internal`.
    #[error("{0}")]
    Internal(String),
    /// 503 `executor_unavailable`: the executor is down or failed.
    #[error("{0}")]
    ExecutorUnavailable(String),
    /// 503 `audit_unavailable`: the decision could not be recorded, so the
    /// run is refused (`audit_required`).
    #[error("the run is refused because it cannot be audited: {0}")]
    AuditUnavailable(String),
    /// 500 `audit_incomplete`: the run ended but its completion row could
    /// not be committed, so its report is withheld (`audit_required`). It
    /// ran: a retry would run it again.
    #[error(
        "the run ended ({outcome}) but its audit rows could not be committed, so its report \
         is withheld (audit_required): {cause}"
    )]
    AuditIncomplete {
        /// The run's outcome.
        outcome: String,
        /// Why the rows could not be committed.
        cause: String,
    },
    /// 503 `audit_unavailable`: the audit trail cannot be read
    /// (`GET /v1/audit`).
    #[error("the audit trail cannot be read: {0}")]
    AuditUnreadable(String),
    /// 503 `busy`: no run slot, or the executor is at its cap. Carries the
    /// report (outcome `busy`).
    #[error("{}", .0.error.as_deref().unwrap_or("busy"))]
    Busy(Box<RunReport>),
}

/// The most characters of a requested name an answer echoes.
pub const ECHOED_NAME_CHARS: usize = 128;

/// `text` quoted and escaped (as `{:?}` writes it), at most `max`
/// characters of it; when cut, `…` and its length in bytes follow.
pub fn quoted(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &text[..cut], text.len()),
    }
}

impl ApiError {
    /// The 404 of a skill name the caller cannot see: none is registered
    /// (or one is, hidden from this caller). The name is echoed bounded
    /// ([`ECHOED_NAME_CHARS`]).
    pub fn no_such_skill(name: &str) -> Self {
        ApiError::NotFound(format!("no skill named {}", quoted(name, ECHOED_NAME_CHARS)))
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidArgs { .. } => StatusCode::BAD_REQUEST,
            ApiError::Denied { .. } | ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Internal(_) | ApiError::AuditIncomplete { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ApiError::ExecutorUnavailable(_)
            | ApiError::Busy(_)
            | ApiError::AuditUnavailable(_)
            | ApiError::AuditUnreadable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::InvalidArgs { .. } => "invalid_args",
            ApiError::Denied { .. } => "denied",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::AuditUnavailable(_) | ApiError::AuditUnreadable(_) => "audit_unavailable",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::TooLarge(_) => "payload_too_large",
            ApiError::UnsupportedEncoding(_) => "unsupported_encoding",
            ApiError::HeadTooLarge(_) => "head_too_large",
            ApiError::Internal(_) => "internal",
            ApiError::AuditIncomplete { .. } => "audit_incomplete",
            ApiError::ExecutorUnavailable(_) => "executor_unavailable",
            ApiError::Busy(_) => "busy",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut error = json!({"code": self.code(), "message": self.to_string()});
        let mut body = json!({});
        match self {
            ApiError::InvalidArgs { violations, .. } => error["violations"] = json!(violations),
            ApiError::Busy(report) => body["report"] = json!(report),
            ApiError::Denied { reason, .. } => error["reason"] = json!(reason),
            _ => {}
        }
        body["error"] = error;
        body
    }
}

impl IntoResponse for ApiError {
    /// The status and JSON body. A 405's `Allow` header is the router's
    /// (axum adds the methods of the route that matched when none is set);
    /// a 415 says which coding is accepted (`Accept-Encoding: identity`,
    /// RFC 9110 §15.5.16).
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if let ApiError::UnsupportedEncoding(_) = self {
            response
                .headers_mut()
                .insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use policy::Outcome;

    use super::*;

    #[test]
    fn bodies_have_code_and_message() {
        let cases = [
            (ApiError::BadRequest("x".into()), 400, "bad_request"),
            (ApiError::Denied { reason: "confirm_required", message: "d".into() }, 403, "denied"),
            (ApiError::Forbidden("f".into()), 403, "forbidden"),
            (ApiError::AuditUnavailable("db".into()), 503, "audit_unavailable"),
            (ApiError::AuditUnreadable("db".into()), 503, "audit_unavailable"),
            (ApiError::NotFound("n".into()), 404, "not_found"),
            (ApiError::TooLarge(1), 413, "payload_too_large"),
            (ApiError::UnsupportedEncoding("gzip".into()), 415, "unsupported_encoding"),
            (ApiError::HeadTooLarge(1), 431, "head_too_large"),
            (ApiError::ExecutorUnavailable("down".into()), 503, "executor_unavailable"),
        ];
        for (e, status, code) in cases {
            assert_eq!(e.status().as_u16(), status);
            let b = e.body();
            assert_eq!(b["error"]["code"], code);
            assert!(b["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn a_404_echoes_a_bounded_name() {
        let e = ApiError::no_such_skill("nope");
        assert_eq!(e.to_string(), r#"no skill named "nope""#);
        let e = ApiError::no_such_skill("a\"\n\u{1b}");
        assert_eq!(e.to_string(), r#"no skill named "a\"\n\u{1b}""#);
        let exact = "é".repeat(ECHOED_NAME_CHARS);
        assert_eq!(quoted(&exact, ECHOED_NAME_CHARS), format!("{exact:?}"));
        let long = format!("{exact}x{}", "y".repeat(60_000));
        let e = ApiError::no_such_skill(&long);
        assert_eq!(e.to_string(), format!("no skill named {exact:?}… ({} bytes)", long.len()));
        assert!(e.body().to_string().len() < 400);
    }

    #[test]
    fn an_unreadable_trail_is_not_called_a_refused_run() {
        let e = ApiError::AuditUnreadable("database is locked".into());
        assert_eq!(
            e.body()["error"]["message"],
            "the audit trail cannot be read: database is locked"
        );
        let run = ApiError::AuditUnavailable("disk full".into());
        assert!(run.to_string().starts_with("the run is refused"));
    }

    /// A run that ended with its audit rows not committed is not called
    /// refused, nor answered as one a client should retry: it ran.
    #[test]
    fn a_run_that_ended_unaudited_is_not_called_refused_or_retryable() {
        let e = ApiError::AuditIncomplete { outcome: "ok".into(), cause: "disk full".into() };
        assert_eq!((e.status().as_u16(), e.code()), (500, "audit_incomplete"));
        let message = e.to_string();
        assert!(message.starts_with("the run ended (ok) but its audit rows"), "{message}");
        assert!(!message.contains("refused"), "{message}");
        assert_ne!(crate::cli::remote::status_exit_code(e.status()), 6, "not `retry later`");
    }

    #[test]
    fn invalid_args_lists_violations_and_busy_carries_a_report() {
        let e = ApiError::InvalidArgs {
            skill: "s".into(),
            violations: vec![Violation { path: "/n".into(), message: "bad".into() }],
        };
        assert_eq!(e.body()["error"]["violations"][0]["path"], "/n");
        let e = ApiError::Busy(Box::new(RunReport::not_run("s", Outcome::Busy, "full")));
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.body()["report"]["outcome"], "busy");
        assert_eq!(e.body()["error"]["message"], "full");
        let e = ApiError::Denied { reason: "approval_expired", message: "late".into() };
        assert_eq!(e.body()["error"]["reason"], "approval_expired");
    }
}
