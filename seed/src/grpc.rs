//! The `loyalty.Accrual/Accrue` gRPC method, proto-free: tonic with a JSON codec, so no
//! `protoc` and no build script.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut};
use serde::{Deserialize, Serialize};
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;

/// The method's path.
pub const ACCRUE: &str = "/loyalty.Accrual/Accrue";

/// An `Accrue` call: points for an order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccrueRequest {
    /// The order (also the call's idempotency key).
    pub order: String,
    /// Points to add.
    pub points: u32,
}

/// The answer: which pod accrued the points.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccrueReply {
    /// The pod's cluster.
    pub cluster: String,
    /// The pod's address (pod IP and container port) as the cluster knows it.
    pub pod: SocketAddr,
    /// The order.
    pub order: String,
}

/// Messages as JSON.
pub struct JsonCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for JsonCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for JsonCodec<E, D>
where
    E: Serialize + Send + 'static,
    D: for<'de> Deserialize<'de> + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = JsonEncoder<E>;
    type Decoder = JsonDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

/// Encodes a message as JSON.
pub struct JsonEncoder<E>(PhantomData<fn(E)>);

impl<E: Serialize> Encoder for JsonEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        serde_json::to_writer(dst.writer(), &item).map_err(|e| Status::internal(e.to_string()))
    }
}

/// Decodes a JSON message.
pub struct JsonDecoder<D>(PhantomData<fn() -> D>);

impl<D: for<'de> Deserialize<'de>> Decoder for JsonDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("not an AccrueRequest: {e}")))
    }
}

/// The `loyalty.Accrual` service of one pod on one port.
#[derive(Clone, Debug)]
pub struct Accrual {
    /// The pod's cluster.
    pub cluster: String,
    /// The pod's address as the cluster knows it.
    pub pod: SocketAddr,
}

impl NamedService for Accrual {
    const NAME: &'static str = "loyalty.Accrual";
}

impl tower::Service<http::Request<Body>> for Accrual {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let (cluster, pod) = (self.cluster.clone(), self.pod);
        Box::pin(async move {
            if req.uri().path() != ACCRUE {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let accrue = tower::service_fn(move |call: tonic::Request<AccrueRequest>| {
                let cluster = cluster.clone();
                async move {
                    let order = call.into_inner().order;
                    Ok::<_, Status>(tonic::Response::new(AccrueReply {
                        cluster,
                        pod,
                        order,
                    }))
                }
            });
            let codec = JsonCodec::<AccrueReply, AccrueRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(accrue, req).await)
        })
    }
}
