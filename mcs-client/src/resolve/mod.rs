//! Resolvers: where endpoint sets come from.
//!
//! A resolver implements [`mcs_core::discovery::Resolve`]: for a [`Target`] (a service and
//! a port) it returns an endless stream of [`Update`]s. This crate has two:
//!
//! - [`StaticResolver`]: endpoint lists set in code and changed at runtime, for tests,
//!   examples and fixed deployments;
//! - [`DnsResolver`] (feature `dns`): the `clusterset.local` DNS names, SRV first so that
//!   endpoints of headless services keep their cluster.
//!
//! The Kubernetes resolver lives in `mcs-kube` and plugs in the same way.
//!
//! [`Target`]: mcs_core::discovery::Target
//! [`Update`]: mcs_core::discovery::Update

#[cfg(feature = "dns")]
mod dns;
mod fixed;

#[cfg(feature = "dns")]
pub use dns::{DnsBuildError, DnsResolver, DnsResolverBuilder};
pub use fixed::StaticResolver;

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::mpsc;

/// An unbounded receiver as a stream.
#[derive(Debug)]
pub(crate) struct ReceiverStream<T>(pub(crate) mpsc::UnboundedReceiver<T>);

impl<T> Stream for ReceiverStream<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}
