//! Plain HTTP (health endpoints, etcd's JSON gateway, an admin endpoint) through
//! hyper-util's client.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// `GET url` (`http://` only): the status and the body as text.
pub async fn http_get(url: &str) -> Result<(StatusCode, String), String> {
    let request = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("GET {url}: {e}"))?;
    send(request).await
}

/// `POST url` (`http://` only) with a JSON body: the status and the body as text.
pub async fn http_post_json(
    url: &str,
    body: &serde_json::Value,
) -> Result<(StatusCode, String), String> {
    let request = Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("POST {url}: {e}"))?;
    send(request).await
}

async fn send(request: Request<Full<Bytes>>) -> Result<(StatusCode, String), String> {
    let what = format!("{} {}", request.method(), request.uri());
    // A client per request: its pooled connections belong to the calling test's runtime.
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{what}: reading the body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
