//! Offline notifications' settings (docs/api.md §31–§32), one function:
//! `registerDevice` — `PUT /devices/{deviceId}`, `devices` — `GET /devices`,
//! `unregisterDevice` — `DELETE /devices/{deviceId}`,
//! `setNotifications` — `PUT /conversations/{conversationId}/notifications`.

use chat_domain::notify::{device_id_param, DeviceRegistration, NotificationSettings};
use chat_domain::requests::conversation_id_param;
use chat_domain::ChatError;
use chat_http::http::{self, App};
use chat_http::routes::Operation;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let device = || device_id_param(http::path_param(&req, "deviceId").as_deref());
    match http::operation(&req).ok_or(ChatError::NotFound)? {
        Operation::RegisterDevice => {
            let (id, registration) = (device()?, DeviceRegistration::parse(http::body(&req)?)?);
            let device = app.store.register_device(&caller, &id, &registration, None);
            http::json(200, &device.await?)
        }
        Operation::Devices => {
            let devices = app.store.devices(&caller).await?;
            http::json(200, &serde_json::json!({ "devices": devices }))
        }
        Operation::UnregisterDevice => {
            app.store.unregister_device(&caller, &device()?).await?;
            http::no_content()
        }
        Operation::SetNotifications => {
            let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
            let settings = NotificationSettings::parse(http::body(&req)?)?;
            http::json(
                200,
                &app.store.set_notifications(&caller, &id, &settings).await?,
            )
        }
        _ => Err(ChatError::NotFound),
    }
}
