"""Preemption: the preempt verb's reading of kube-scheduler's proposed victims
(``proposals``), choosing victims off the cache lock for GPU room (``planner``) and for a
full TenantQuota (``tenantpreempt``), the plans' values (``plans``) and carrying a plan out
(``preemptor``)."""
