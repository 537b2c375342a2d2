//! The aggregator's traces: its `tracing` spans (ingest requests, writer commits, analytics
//! passes, webhook deliveries) become OpenTelemetry spans through `tracing-opentelemetry`, and a
//! batch span processor sends them to `config.endpoint` + `/v1/traces` (OTLP/HTTP, protobuf).
//! A span's fields become its attributes; spans opened inside another are its children.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::{Error, OtlpConfig, Service};

/// A running span export; [`Traces::shutdown`] sends what is still buffered.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts the export; hand the result to [`crate::init_logging`] so spans reach it.
    pub fn start(config: &OtlpConfig, service: &Service) -> Result<Self, Error> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.signal_url("traces"))
            .with_timeout(config.timeout)
            .with_headers(config.headers_map())
            .build()
            .map_err(|e| Error::Build(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_resource(service.resource())
            .with_batch_exporter(exporter)
            .build();
        Ok(Traces { provider })
    }

    pub(crate) fn tracer(&self) -> SdkTracer {
        self.provider.tracer("gpuledger")
    }

    /// Sends the spans still buffered and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "The last OTLP span export failed.");
        }
    }
}
