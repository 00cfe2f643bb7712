"""upstream-diff: the PR series in patches/v<base>/ against pristine kagent-adk, and the port report.

``./upstream-diff`` runs ``cli.main``; ``./upstream-diff --help`` says what each verb does. One concept a module:

    releases    the supported releases (read from the package's source) and 1.0.0a17, the base a run is for,
                and the interpreter that runs it
    shell       git, pip, ruff and pytest as subprocesses, one beside the rest; scratch directories; what is printed
    pristine    a release's own files (its wheel's RECORD) as the root commit of a scratch git tree
    mails       a series' mails: the listing, Depends-on lines, the placeholder sign-off, index lines and hunks
    series      cut, check (each patch alone; git am -3 on a moved base) and export a series
    lint        ruff with upstream's configuration: what a series adds
    signatures  an upstream name's signature, read from source, never imported
    port        the port report: each name the package uses, on the base and on 1.0.0a17, with a verdict
    check       the check verb: the series, their tests, the report, this package's suite in entry-point mode
    cli         the verbs, their options and their help

The ``releases`` verb runs under the system's Python before any virtualenv exists: everything here imports the
standard library only.
"""
