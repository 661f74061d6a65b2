"""The admission webhook: guards gpupool's decision annotations and a GPU pod's
environment, completes GPU pods (scheduler name, implied ``gpupool.io/gpu``, their
namespace's placement) and validates ResourceClasses and ResourceGroups. See
docs/webhook.md and docs/security.md."""
