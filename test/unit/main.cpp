// Catch2 v2 provides main() through this definition.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
