# Structured output (owner: structured): the grammar library, decoding controls, and the corpus of JSON
# Schemas run on the test checkpoints and validated with Python's jsonschema (Debian python3-jsonschema).
if(TARGET moeq_grammar)
  moeq_add_test(NAME test_grammar SOURCES test_grammar.c LIBS moeq_grammar LABELS unit)
endif()
