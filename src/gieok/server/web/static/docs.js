// /docs: swagger-ui over this server's own OpenAPI document, from the vendored bundle (no CDN, no
// inline script: the dashboard's content security policy applies). "Authorize" takes an API key
// (the document's bearer scheme); it is kept in this page's memory only, never in storage.
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    deepLinking: true,
    persistAuthorization: false,
    tryItOutEnabled: false,
    validatorUrl: null,
  });
});
