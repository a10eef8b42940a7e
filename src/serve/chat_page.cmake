# Embeds chat_page.html in the executable: the page's text becomes a raw string literal in a
# generated source, so `entropyinfer serve` needs no files at run time. Editing the page
# re-runs this at the next build.
set(ENTROPYINFER_CHAT_PAGE_HTML ${CMAKE_CURRENT_SOURCE_DIR}/src/serve/chat_page.html)
set(ENTROPYINFER_CHAT_PAGE_TEMPLATE ${CMAKE_CURRENT_SOURCE_DIR}/src/serve/chat_page.cpp.in)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${ENTROPYINFER_CHAT_PAGE_HTML} ${ENTROPYINFER_CHAT_PAGE_TEMPLATE})
file(READ ${ENTROPYINFER_CHAT_PAGE_HTML} ENTROPYINFER_CHAT_PAGE_TEXT)
# The literal's delimiter (at most 16 characters); the page must not contain its closing sequence.
string(FIND "${ENTROPYINFER_CHAT_PAGE_TEXT}" ")chat_page_html\"" ENTROPYINFER_CHAT_PAGE_CLASH)
if(NOT ENTROPYINFER_CHAT_PAGE_CLASH EQUAL -1)
  message(FATAL_ERROR "${ENTROPYINFER_CHAT_PAGE_HTML} contains the raw string delimiter "
    "')chat_page_html\"'")
endif()
set(ENTROPYINFER_CHAT_PAGE_SOURCE ${CMAKE_CURRENT_BINARY_DIR}/generated/chat_page.cpp)
configure_file(${ENTROPYINFER_CHAT_PAGE_TEMPLATE} ${ENTROPYINFER_CHAT_PAGE_SOURCE} @ONLY)
