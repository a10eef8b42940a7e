// The chat page served at GET /: static HTML and JavaScript (chat_page.html), embedded in the
// executable at build time (chat_page.cmake).
#pragma once

#include <string_view>

namespace entropyinfer::serve {

std::string_view chat_page_html();

}  // namespace entropyinfer::serve
