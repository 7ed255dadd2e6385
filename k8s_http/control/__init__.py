"""Control: turning cached changes into reconciles, and running them.

`manager` (wires everything), `workqueue` and `runner` (keys to workers),
`leader` (Lease election), `events` (core/v1 Events), `deletionwatch`, and the
reconcile policies a reconciler may use: `statushold`, `settled`, `memo`,
`writethrough`, `podstatus`. The top wing: it may import every other one.
"""
