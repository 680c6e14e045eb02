# Tokenizer tests (owner: tokenizer). test_tokenizer reads the golden vectors
# in tests/tokenizer/vectors/ and DeepSeek-V3's files from
# .deps/tokenizers/deepseek_v3/ (scripts/setup.sh puts them there).
if(TARGET moeq_tokenizer)
  moeq_add_test(NAME test_tokenizer SOURCES test_tokenizer.c
    LIBS moeq_tokenizer PkgConfig::CJSON Threads::Threads LABELS unit TIMEOUT 300)
  target_compile_definitions(test_tokenizer PRIVATE MOEQ_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()
