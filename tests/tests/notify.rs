//! Offline notifications (docs/api.md §31–§33): devices, settings, and the delayed decision
//! through the notifier, SQS (moto, which honours DelaySeconds) and the push sink; delivery
//! through SNS mobile push (moto's).

#[path = "notify/delivery.rs"]
mod delivery;
#[path = "notify/devices.rs"]
mod devices;
#[path = "notify/sns.rs"]
mod sns;
