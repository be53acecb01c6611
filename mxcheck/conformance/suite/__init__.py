"""The conformance suite as installed test modules, runnable from any directory.

    mxcheck conform --backend mypkg.kernels:make_backend --recipe ocp-mxfp8-e4m3

or, equivalently, with pytest itself::

    pytest --pyargs mxcheck.conformance.suite --mxcheck-backend mypkg.kernels:make_backend \\
        --mxcheck-recipe ocp-mxfp8-e4m3

Every check of ``mxcheck.conformance.CHECKS`` and every edge shape runs on every claim of
every selected backend (``mxcheck.conformance.claims``).
"""
