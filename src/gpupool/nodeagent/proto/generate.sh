#!/bin/sh
# Regenerate the Python gRPC modules from the .proto files in this folder.
# Run from anywhere; needs grpcio-tools (in the dev extras).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
python=${PYTHON:-python3}
cd "$root"
"$python" -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. \
  gpupool/nodeagent/proto/deviceplugin.proto gpupool/nodeagent/proto/podresources.proto \
  gpupool/nodeagent/proto/pluginregistration.proto \
  gpupool/nodeagent/proto/dra_v1.proto gpupool/nodeagent/proto/dra_v1beta1.proto
