"""The report: the comparison table per configuration (comparison), the data it is read from (data), the
console and CSV tables (tables), the HTML page (html), the plots (plots), the analyses' sections (sections)
and the folder it is written to (writer)."""
