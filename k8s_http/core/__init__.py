"""The foundation every wing stands on: plain-dict objects and the rules about them.

Resource types and object helpers (`objects`), the exception tree (`errors`),
the apiserver's name rules (`names`), quantities (`quantity`), whether an apply
would change an object (`applydiff`), and backoff arithmetic (`backoff`).
Nothing here opens a socket, starts a thread or reads a file; nothing here
imports another wing.
"""
