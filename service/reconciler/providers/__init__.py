"""Providers: declarative provider files, their state tables and the adapters that call them.

``spec`` is the typed model and ``loader`` reads and validates the files into it;
``state_table`` classifies remote states; ``pointer`` resolves JSON pointers;
``adapter`` defines the adapter protocol, the typed call results and the pure
readings of bodies; ``http_adapter`` is the declarative httpx implementation;
``transport`` names the network failure behind an exception.
"""
