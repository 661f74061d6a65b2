"""Pure codecs for what gpupool components exchange through the Kubernetes API.

No I/O here: strings and already-decoded JSON in, core values out (and back).
The extender writes decisions, the node agent reads them; both use these
functions so the encoding exists once. The spec is docs/protocol.md.
"""
