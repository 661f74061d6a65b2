"""Generated gRPC modules for the kubelet device plugin API (v1beta1) and the
PodResources API (v1). Regenerate with ``generate.sh``; never edit the
``*_pb2*.py`` files by hand."""
