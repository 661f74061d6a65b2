"""gpupool's HTTP/1.1 edge, shared by the servers others can reach (the extender's and
the webhook's): which bytes of a connection are a request's head and which its body
(``framing``), who may hold a connection and for how long (``connections``), and uvicorn
configured with those rules (``serving``). It decides nothing about requests' contents:
each server sizes its own rules and bodies."""
