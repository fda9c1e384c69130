"""Providers: declarative provider files, their state tables and the adapters that call them.

``spec`` holds the typed models (pydantic, strict and frozen) that are both the
parsed file and the runtime spec: ``ProviderSpec`` over the tables of
``sections``, all based on ``base.FileTable`` and built from the value types of
``fields`` and ``rules``; ``loader`` reads the files, merges presets (``presets/*.toml``) and turns
the first validation failure into one line; ``secrets`` reads the variables a file
names;
``state_table`` classifies remote states; ``pointer`` resolves JSON pointers;
``adapter`` defines the adapter protocol, the typed call results and the pure
readings of bodies; ``http_adapter`` is the declarative httpx implementation, its
calls made by ``exchange`` (bodies decoded within a limit by ``decoding``) and its
result files fetched by ``result_fetch`` (where a provider may send us);
``result_check`` checks a result from the report of a streaming scan
(``result_scan``, run off the event loop by ``scan_runner`` over a ``spool``);
``transport`` names the network failure behind an exception.
"""
