//! The mock provider server. Placeholder.
