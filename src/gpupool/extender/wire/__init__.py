"""kube-scheduler's extender wire format: its bodies read and answers rendered
(``protocol``), the node names it sends matched to state rows and scores scaled to its
range (``nodenames``), a pod's resources read into a core request (``podspec``) and the
reasons filter gives refused nodes (``refusals``). Pure translation: no state, no I/O."""
