"""The dashboard: server-rendered HTML pages of a tenant's jobs, their eval curves and the tenant's totals.

The pages work without JavaScript and load nothing from outside the service (clusters often have no internet): the
CSS and a small refresh script are inline, allowed by a per-response nonce in the Content-Security-Policy, and the
eval curve is inline SVG. What is here: the sign-in sessions (:mod:`.sessions`), the reads the pages make
(:mod:`.data`, the one place that talks to the store), the curve (:mod:`.svg`) and the HTML (:mod:`.pages`). The
routes are in :mod:`platform_sim.service.routes.dashboard`.
"""
