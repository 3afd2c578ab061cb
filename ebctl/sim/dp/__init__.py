"""The data-parallel simulator: several ranks behind one dispatcher, for SBS against sglang's own dispatch.

``costs`` (the DP+EP cost model), ``ranks`` (a prefill rank and an instance of ranks in lockstep),
``dispatch`` (round-robin and total-tokens as sglang 0.5.23 does them, and ``sbs`` on the pure core in
``ebctl.sbs``), ``run`` (the event loop and its metrics), ``decode`` (a decode pool placing requests by
Algorithm 3 or sglang's rules), ``cli`` (``ebctl simulate --dp N``).

The model is the prefill side of a prefill/decode-disaggregated deployment, as the SBS paper measures it:
a request's first token is out when its prompt is prefilled. Assumptions are stated where they are made.
"""
